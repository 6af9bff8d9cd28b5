"""How a command ends when a signal finds it at an edge: a terminal that closes under it, a SIGHUP that `nohup`
ignores, a stop that comes once its output is published, and a local Ray that cannot write its files."""
from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from runtime import atomic_file, destination

from support.processes import alive, default_stops, process_state
from support.reliability import SHIPPED_CHECKPOINT
from support.serve import DATES

INFER = [sys.executable, "-m", "cli", "infer", str(DATES)]


def _texts(path: Path, n: int) -> Path:
    path.write_text("".join(f"march {i % 28 + 1} 19{i % 100:02d}\n" for i in range(n)))
    return path


def _wait_for_staging(directory: Path, name: str, running: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(f".{name}.") for p in directory.iterdir()):
        assert running() and time.monotonic() < deadline, "it ended before its staging appeared"
        time.sleep(0.02)


def _ignore_hang_up() -> None:
    default_stops()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` starts a command


def test_a_hang_up_ignored_from_the_start_stays_ignored(tmp_path: Path) -> None:
    """`nohup seq2onnx infer ...`: the SIGHUP of a closed terminal does not stop it; it writes every record."""
    texts, out = _texts(tmp_path / "texts.txt", 5000), tmp_path / "out.jsonl"
    with subprocess.Popen([*INFER, "--input", str(texts), "--output", str(out)], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_ignore_hang_up) as proc:
        _wait_for_staging(tmp_path, "out.jsonl", lambda: proc.poll() is None)
        proc.send_signal(signal.SIGHUP)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert len(out.read_text().splitlines()) == 5000 and sorted(tmp_path.iterdir()) == [out, texts]


def _on_a_terminal_that_closes(argv: list[str], cwd: Path, ready: Callable[[], bool]) -> int:
    """Run `argv` on a new terminal (its session's), close the terminal once `ready()`, return the exit status."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: on the new terminal
        try:
            default_stops()  # a hang-up must reach it, whatever the test runner inherited (`nohup`)
            os.chdir(cwd)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    try:
        deadline = time.monotonic() + 240
        while not ready():
            while select.select([terminal], [], [], 0)[0]:  # keep the terminal drained
                if not os.read(terminal, 65536):
                    break
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "it ended before it was ready"
            assert time.monotonic() < deadline, "it was not ready in time"
            time.sleep(0.02)
        os.close(terminal)
        terminal = -1
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            assert time.monotonic() < deadline, "it did not stop after its terminal closed"
            time.sleep(0.05)
        return done[1]
    finally:
        if terminal >= 0:
            os.close(terminal)
        try:
            os.killpg(pid, signal.SIGKILL)  # the session's group: a launcher's ranks too
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _staged(directory: Path, name: str) -> Callable[[], bool]:
    return lambda: any(p.name.startswith(f".{name}.") for p in directory.iterdir())


@pytest.mark.parametrize("source", ["file", "terminal"])
def test_a_terminal_that_closes_stops_infer_as_sigterm_does(tmp_path: Path, source: str) -> None:
    """The terminal the command runs on closes (the kernel hangs it up: SIGHUP to its group, and every later read
    or write there fails with EIO): it stops in order, exit 143, nothing left. It exited 1 before ('lost
    sys.stderr': the stop's last line failed on the closed terminal). Reading its texts from that terminal, it left
    its staged output behind for good: the SIGTERM landed inside the removal that the failed read set off."""
    texts, out = _texts(tmp_path / "texts.txt", 20000), tmp_path / "out.jsonl"
    given = str(texts) if source == "file" else "-"
    status = _on_a_terminal_that_closes([*INFER, "--input", given, "--output", str(out)], tmp_path,
                                        _staged(tmp_path, "out.jsonl"))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, status
    assert sorted(tmp_path.iterdir()) == [texts]


@pytest.mark.slow  # two training processes
def test_a_terminal_that_closes_stops_a_launched_run_as_sigterm_does(tmp_path: Path) -> None:
    """torchrun's handler takes the launcher's SIGHUP, not ours: its last line failed on the closed terminal, exit 1.
    Now 143, and the state saved is kept for --resume."""
    pytest.importorskip("torch", reason="training needs the train extra")
    out = tmp_path / "ckpt"
    state = tmp_path / "ckpt.partial" / "train_state.pt"
    status = _on_a_terminal_that_closes(
        [sys.executable, "-m", "cli", "train", "--data", "reverse", "--hidden-dim", "32", "--embedding-dim", "16",
         "--eval-beam", "0", "--epochs", "50", "--out", str(out), "--nproc-per-node", "2"], tmp_path, state.is_file)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, status
    assert state.is_file() and not out.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["sigterm", "sighup", "ctrl-c"])
def test_a_stop_once_the_output_is_written_finds_the_work_done(tmp_path: Path, sig: int) -> None:
    """The signal comes as 'wrote' is said, while the command frees its model on its way out: exit 0 with the
    output in place. It said 'stopped by SIGTERM; nothing was written' with the file written, exit 143 (or died of
    SIGHUP or SIGINT as the interpreter shut down)."""
    out = tmp_path / "out.jsonl"
    for _ in range(3):
        with subprocess.Popen([*INFER, "--text", "3/3/15", "--output", str(out), "--force"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=default_stops) as proc:
            said = []
            while not said or not said[-1].startswith("wrote "):
                line = proc.stderr.readline()
                assert line, "".join(said)
                said.append(line)
            proc.send_signal(sig)
            _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 0, "".join(said) + rest
        assert "Error" not in rest and out.read_text().count("\n") == 1


@pytest.mark.ray
@pytest.mark.parametrize("command", [["infer", str(DATES), "--ray", "--text", "3/3/15", "--output", "out.jsonl"],
                                     ["serve", str(DATES), "--ray", "--port", "1"]], ids=["infer", "serve"])
def test_a_local_ray_that_cannot_write_its_files_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """Ray keeps a local instance's files in RAY_TMPDIR, else TMPDIR, else /tmp: where it cannot make them, one
    line saying so and what to set, exit 1 (it was Ray's traceback of ~60 lines), and no Ray left running."""
    env = {**os.environ, "RAY_TMPDIR": "/dev/null/ray", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "cli", *command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    prefix = "serve" if command[0] == "serve" else "--ray"
    assert done.stderr.strip().endswith(
        f"Error: {prefix}: could not start a local Ray (Not a directory: /dev/null/ray); a local Ray keeps its files "
        "in RAY_TMPDIR, else TMPDIR, else /tmp: set RAY_TMPDIR or TMPDIR to a writable directory"), done.stderr
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.ray
def test_a_home_where_ray_cannot_keep_its_token_is_named(tmp_path: Path) -> None:
    """A local Ray makes its authentication token in ~/.ray: with a HOME that cannot hold it, the line names HOME
    (it blamed RAY_TMPDIR, which was fine)."""
    env = {**os.environ, "HOME": "/dev/null/home", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_TOKEN", None)
    done = subprocess.run([*INFER, "--ray", "--text", "3/3/15", "--output", "out.jsonl"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().endswith(
        "Error: --ray: could not start a local Ray (Not a directory: /dev/null/home/.ray); a local Ray keeps its "
        "authentication token in ~/.ray/auth_token (HOME is /dev/null/home): make HOME writable, or give the token "
        "in RAY_AUTH_TOKEN"), done.stderr
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.ray
def test_a_ray_directory_too_long_for_its_sockets_says_what_to_set(tmp_path: Path) -> None:
    """A RAY_TMPDIR whose session paths exceed a Unix socket's 107 bytes: Ray's reason and what to set instead
    (it was Ray's reason alone)."""
    long = tmp_path / ("x" * 80)
    long.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(long), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([*INFER, "--ray", "--text", "3/3/15", "--output", "out.jsonl"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --ray: could not start a local Ray (") and "AF_UNIX path length" in last, last
    assert last.endswith("(here RAY_TMPDIR), and a socket's path must fit in 107 bytes: set RAY_TMPDIR to a "
                         "directory with a shorter path"), last
    assert sorted(tmp_path.iterdir()) == [long]


def test_a_stop_between_two_outputs_names_the_one_written() -> None:
    """`infer --output O --plot P` stopped after O is published, before P: the line says O was written (it said
    that nothing was)."""
    import click

    from cli import common
    from cli.main import _stopped, main
    from runtime.errors import Terminated

    ctx = click.Context(main)
    ctx.invoked_subcommand = "infer"
    common.WRITTEN[:], common.KEPT[:], common.PRINTED[0] = ["out.jsonl"], [], 0  # as `invoke` sets them up
    try:
        said = _stopped(ctx, Terminated()).message
    finally:
        common.WRITTEN.clear()
    assert said == "infer: stopped by SIGTERM; it had written out.jsonl, and nothing else"
    assert _stopped(ctx, KeyboardInterrupt()).message.startswith("infer: interrupted; nothing was written")


def test_messages_that_cannot_be_written_cost_the_run_nothing(tmp_path: Path) -> None:
    """stderr on a full disk (as on a terminal that closed while SIGHUP is ignored): progress and 'wrote' are lost,
    the output is written whole and the exit is 0. The first progress line failed the run: exit 1, nothing
    written, and its last line blamed --output."""
    texts, out = _texts(tmp_path / "texts.txt", 3000), tmp_path / "out.jsonl"
    with open("/dev/full", "w") as full:
        done = subprocess.run([*INFER, "--input", str(texts), "--output", str(out)], cwd=tmp_path, stderr=full,
                              stdout=subprocess.PIPE, timeout=120)
    assert done.returncode == 0
    assert len(out.read_text().splitlines()) == 3000 and sorted(tmp_path.iterdir()) == [out, texts]


@pytest.mark.parametrize("text, records", [("march 3 2015\n\nmay 1 1999\n", 2), ("", 0)], ids=["blank-line", "empty"])
def test_a_note_after_the_output_that_cannot_be_written_costs_nothing(tmp_path: Path, text: str,
                                                                         records: int) -> None:
    """The notes said after the records (blank lines skipped, an input with no text) go the way of 'wrote' on an
    unwritable stderr: the records on stdout stand and the exit is 0. They failed the run, exit 1."""
    texts = tmp_path / "texts.txt"
    texts.write_text(text)
    with open("/dev/full", "w") as full:
        done = subprocess.run([*INFER, "--input", str(texts)], cwd=tmp_path, stderr=full, stdout=subprocess.PIPE,
                              timeout=120)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == records


# A process that ends itself once the first of its children is gone, as Ray's core worker thread in infer --ray's
# driver does when the raylet's object store socket breaks ("Terminate the process", status 1, in the driver's log
# only), and whose other thread logs all the while, as Ray Data's does ("Starting execution of Dataset ..."). Its
# children ignore SIGHUP, as Ray's agents block it, and with more than one, the last is in a process group of its
# own, as Ray's workers are.
KILL_RACE = """
import os, subprocess, sys, threading, time
from cli.ray_stop import _kill_and_exit

CHILD = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
children = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             process_group=0 if 0 < i == CHILDREN - 1 else None) for i in range(CHILDREN)]
for child in children:
    child.stdout.readline()
print(" ".join(str(child.pid) for child in children), flush=True)


def watch():
    children[0].stdout.read()  # EOF once the first child is gone
    os._exit(1)


def chatter():
    while True:
        sys.stderr.write("a thread's late log line\\n")  # one write, as a logging handler's
        sys.stderr.flush()


threading.Thread(target=watch, daemon=True).start()
threading.Thread(target=chatter, daemon=True).start()
time.sleep(0.05)
_kill_and_exit("infer --ray", "a second signal while stopping", "; nothing was written", 143)
"""


@pytest.mark.parametrize("children", [1, 6])
def test_a_kill_says_so_last_and_exits_with_its_status_before_its_own_threads_see_the_children_go(
        tmp_path: Path, children: int) -> None:
    """cli.ray_stop's kill (a second signal, or a stop past its deadline) stops what it started, says so, then
    exits, and what it started is killed once it is gone. It killed first and said so after waiting for the
    children to go, and in a CI run Ray's core worker thread ended the process first (status 1, nothing said),
    finding the raylet's socket broken; it then said so before killing, and with 9 processes to kill the same
    thread still won 1 time in 14 here under load (the line said, status 1), and Ray Data's log lines came after
    the line in another. Run in a process group of its own within this session, as a shell runs a command: as it
    exits, its group, holding stopped processes, is orphaned and gets SIGHUP then SIGCONT, which killed a killer in
    the group (the children that ignore SIGHUP lived on, the one in its own group stayed stopped)."""
    with open(tmp_path / "log", "w") as log:  # a file: a thread's write blocked on a full pipe lands when it can
        done = subprocess.run([sys.executable, "-c", KILL_RACE.replace("CHILDREN", str(children))],
                              stdout=subprocess.PIPE, stderr=log, text=True, timeout=60, process_group=0,
                              cwd=Path(__file__).resolve().parents[1])
    pids = [int(pid) for pid in done.stdout.split()]
    try:
        said = (tmp_path / "log").read_text().splitlines()
        assert done.returncode == 143, (done.returncode, said[-3:])
        assert said[-1] == (f"Error: infer --ray: a second signal while stopping: killed the {children} "
                            f"process{'es' if children > 1 else ''} this command had started; nothing was written")
        assert set(said[:-1]) <= {"a thread's late log line"}
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in pids):  # killed once the command is gone
            assert time.monotonic() < deadline, [(pid, process_state(pid)) for pid in pids if alive(pid)]
            time.sleep(0.02)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_stop_inside_the_output_check_leaves_no_hidden_file(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of an output makes and removes the staging sibling the write will use; a Ctrl-C that landed between
    the two left it beside the output for good (the walk of 2026-12-01: a 0-byte `.out.jsonl.<hex>.tmp` beside
    `infer --ray`'s output). Now the stop's `discard_staged`, which the program runs, removes it."""
    real_open = open

    def interrupted(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        real_open(file, mode, *args, **kwargs).close()
        raise KeyboardInterrupt  # a Ctrl-C landing right after the file was made

    monkeypatch.setattr(destination, "open", interrupted, raising=False)
    with pytest.raises(KeyboardInterrupt):
        destination.check_output_file(tmp_path / "out.jsonl", force=False)
    atomic_file.discard_staged()
    assert list(tmp_path.iterdir()) == []


# What the console script runs (`from cli.main import entry; entry()`), with a signal to itself in between: one
# that lands while the program's modules load, before any command runs.
STOP_WHILE_STARTING = ("import os, signal, sys; sys.argv[0] = 'seq2onnx'; import cli.main; "
                       "os.kill(os.getpid(), signal.{}); cli.main.entry(['--version'])")


@pytest.mark.parametrize("sig, code, words", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "stopped by SIGTERM"),
                                             ("SIGHUP", 143, "stopped by SIGTERM")])
def test_a_stop_while_the_program_starts_is_one_line_and_its_exit_code(sig: str, code: int, words: str) -> None:
    """Raised there, Ctrl-C printed a KeyboardInterrupt traceback (exit 1, or killed by SIGINT), and SIGTERM and
    SIGHUP killed the program without a word (a hang-up is a SIGTERM, as once a command runs)."""
    result = subprocess.run([sys.executable, "-c", STOP_WHILE_STARTING.format(sig)], capture_output=True, text=True,
                            timeout=60, preexec_fn=default_stops)
    assert result.returncode == code, result.stderr
    assert result.stderr == f"Error: seq2onnx: {words} while starting; nothing was written\n"
    assert result.stdout == ""


def test_a_ctrl_c_ignored_from_the_start_stays_ignored_while_the_program_starts() -> None:
    """A program started with SIGINT ignored (a background job of a script, `nohup`-like launchers) keeps it so."""
    result = subprocess.run([sys.executable, "-c", STOP_WHILE_STARTING.format("SIGINT")], capture_output=True,
                            text=True, timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert result.returncode == 0 and result.stdout.startswith("seq2onnx, version "), result.stderr


def test_an_import_that_a_stop_broke_is_the_stop_whichever_link_holds_it() -> None:
    """onnxruntime catches its C module's failed import and raises it again outside the except block: a SIGTERM
    there came out as a traceback and exit 1 (the stop was the error's cause, not its context)."""
    from cli.main import _interrupt_behind
    from runtime.errors import Terminated

    stop = Terminated()
    try:
        try:
            raise ImportError("capi") from stop
        except ImportError as caught:
            held = caught
        raise held  # as onnxruntime/__init__.py does: `raise import_capi_exception`
    except ImportError as exc:
        assert _interrupt_behind(exc) is stop
    chained = SystemError("call")
    chained.__context__ = ImportError("inner")
    chained.__context__.__context__ = KeyboardInterrupt()
    assert isinstance(_interrupt_behind(chained), KeyboardInterrupt)
    assert _interrupt_behind(ImportError("no stop behind it")) is None


# `python -m training` (what torchrun starts on every rank) with SIGTERM sent to itself the moment the starting
# handlers go in: a launched run's rank, by its environment.
STOP_AS_A_RANK_STARTS = """
import os, runpy, signal, sys
def stop_as_the_handlers_go_in(frame, event, arg):
    if event == "return" and frame.f_code.co_name == "starting_handlers":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
sys.argv = ["training", "--data", "reverse", "--out", "never"]
sys.setprofile(stop_as_the_handlers_go_in)
runpy.run_module("training", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("rank", "said"), [
    ("1", ""), ("0", "Error: seq2onnx: stopped by SIGTERM while starting; nothing was written\n")])
def test_a_stop_as_a_rank_starts_is_said_by_rank_0_only(tmp_path: Path, rank: str, said: str) -> None:
    """A rank other than 0 leaves a stop to rank 0 to say; its quietness was decided after the handlers went in,
    so a SIGTERM in between printed the line on rank 1 too (a fresh walk saw it once in a 2-rank run)."""
    env = {**os.environ, "RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    result = subprocess.run([sys.executable, "-c", STOP_AS_A_RANK_STARTS], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env=env, preexec_fn=default_stops)
    assert (result.returncode, result.stderr, result.stdout) == (143, said, "")
    assert not (tmp_path / "never").exists()


# A command run as the console script runs it, with a signal sent to itself inside torch's start-up: from the first
# Python function that torch.distributed's C++ `_c10d_init` calls back into (importlib's module locks).
STOP_INSIDE_TORCH_START_UP = """
import os, signal, sys
from cli.main import entry
inside = []
def stop_inside_c10d_init(frame, event, arg):
    if event == "c_call" and getattr(arg, "__name__", "") == "_c10d_init":
        inside.append(True)
    elif event == "call" and inside:
        sys.setprofile(None)
        os.kill(os.getpid(), getattr(signal, os.environ["STOP_WITH"]))
sys.argv[0] = "seq2onnx"
sys.setprofile(stop_inside_c10d_init)
entry(sys.argv[1:])
"""
NOTHING_WRITTEN = "nothing was written (outputs are published whole or not at all)\n"


TRAIN = ("train", "--data", "reverse", "--out", "never")
EXPORT = ("export", str(SHIPPED_CHECKPOINT), "--out", "never")  # a command that needs torch only once it runs


@pytest.mark.parametrize(("args", "rank", "sig", "code", "said"), [
    (TRAIN, "1", "SIGINT", 130, ""),
    (TRAIN, None, "SIGINT", 130, f"Error: train: interrupted; {NOTHING_WRITTEN}"),
    (TRAIN, None, "SIGTERM", 143, f"Error: train: stopped by SIGTERM; {NOTHING_WRITTEN}"),
    (EXPORT, None, "SIGINT", 130, f"Error: export: interrupted; {NOTHING_WRITTEN}"),
])
def test_a_stop_inside_torchs_start_up_is_the_stop(tmp_path: Path, args: tuple[str, ...], rank: str | None, sig: str,
                                                  code: int, said: str) -> None:
    """`import torch` runs torch.distributed's C++ `_c10d_init`, which calls back into Python: a Ctrl-C or SIGTERM
    raised there cannot pass through it, and the process aborted (exit 134, 'terminate called after throwing an
    instance of python_error'; CI saw it on a rank stopped 0.4 s in). The import now holds them; they land after."""
    env = {**os.environ, "STOP_WITH": sig}
    if rank is not None:
        env.update(RANK=rank, WORLD_SIZE="2", LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    result = subprocess.run([sys.executable, "-c", STOP_INSIDE_TORCH_START_UP, *args], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env, preexec_fn=default_stops)
    assert (result.returncode, result.stderr, result.stdout) == (code, said, "")
    assert list(tmp_path.iterdir()) == []
