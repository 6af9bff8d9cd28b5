"""Commands under a process's resource limits (`ulimit`): what the limit allows works, and what it refuses is said
in one line."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from support.serve import DATES, SQUARES
from support.stop_hooks import (
    NO_MEMORY_AT_EXIT,
    OUT_OF_MEMORY_IN_THE_THIRD_EPOCH,
    OUT_OF_MEMORY_WRITING_THE_CHECKPOINT,
    hook_path,
)

ADDRESS_SPACE = 1_500_000 * 1024  # `ulimit -v 1500000`: room for a small model, not for 2 GiB reserved at once


def _limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_a_memory_limit_room_enough_for_the_model_decodes(tmp_path: Path) -> None:
    """Reading a graph reserved its 2 GiB size limit before reading a file of a few hundred KB: under `ulimit -v`
    below that, every load ended in a MemoryError traceback."""
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--text", "3/3/15"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, preexec_fn=_limited_memory)
    assert done.returncode == 0 and "2015-03-03" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize(("kb", "said"), [
    (225_000, None), (125_000, "Error: infer: out of memory; under a memory limit (ulimit -v), raise it")],
    ids=["decodes", "one-line"])
def test_numpys_unused_blas_threads_take_no_address_space(tmp_path: Path, kb: int, said: str | None) -> None:
    """numpy's OpenBLAS started a pool of threads the program never uses, ~50 MB of address space each: infer
    needed ~250 MB of `ulimit -v` to decode, and under 100-140 MB OpenBLAS ended it with its own line
    ('Memory allocation still failed', exit 1). The program now runs it with one thread (the user's
    OPENBLAS_NUM_THREADS, where set, stands)."""
    blas = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")  # OpenBLAS reads each (conftest sets OMP's)
    env = {k: v for k, v in os.environ.items() if k not in blas}
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--text", "3/3/15"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env, preexec_fn=_address_space(kb))
    assert "OpenBLAS" not in done.stderr, done.stderr[-2000:]
    if said is None:
        assert done.returncode == 0 and "2015-03-03" in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode == 1 and done.stderr.splitlines() == [done.stderr.strip()], done.stderr[-2000:]
        assert done.stderr.startswith(said), done.stderr[-2000:]


def _no_room_for_a_thread() -> None:
    """Every new thread's stack (RLIMIT_STACK's size) more than the address space allows: none can start."""
    resource.setrlimit(resource.RLIMIT_STACK, (2 * ADDRESS_SPACE, 2 * ADDRESS_SPACE))
    _limited_memory()


def test_a_session_that_cannot_start_its_threads_blames_the_limit(tmp_path: Path) -> None:
    """onnxruntime's pthread_create failing (`ulimit -u`, `ulimit -v`) said 'could not load the graph ... re-export
    the model', of a model that was fine: now it names the limits, and one intra-op thread (no pool) decodes. And
    stdout, where infer's results go, stays empty: onnxruntime's fallback (off) printed a four-line banner there and
    tried the same provider again."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # numpy's pool would be the first to fail
    run = [sys.executable, "-m", "cli", "infer", str(DATES), "--text", "3/3/15", "--threads"]
    refused = subprocess.run([*run, "2"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
                             preexec_fn=_no_room_for_a_thread)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stdout == "", refused.stdout  # onnxruntime's own fallback printed its "EP Error" banner there
    last = refused.stderr.strip().splitlines()[-1]
    assert "onnxruntime could not start the session: the process could not get a thread or memory" in last, last
    assert last.endswith("raise its limits (ulimit -u, ulimit -v), free memory or use fewer threads (--threads 1; "
                         "under ulimit -v also MALLOC_ARENA_MAX=2: each thread's malloc arena reserves 64 MB of it) "
                         "(the graph is not at fault)"), last
    decoded = subprocess.run([*run, "1"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
                             preexec_fn=_no_room_for_a_thread)
    assert decoded.returncode == 0 and "2015-03-03" in decoded.stdout, decoded.stderr[-2000:]


@pytest.mark.parametrize("arenas", [None, "64"], ids=["capped", "the-users-own"])
def test_a_transformer_of_many_sessions_loads_under_an_address_space_limit(tmp_path: Path, arenas: str | None) -> None:
    """Each onnxruntime thread that allocates got a glibc malloc arena of its own, 64 MB of address space reserved:
    a transformer export's 16 sessions at --threads 2 could not start under `ulimit -v 600000`, where one thread a
    session fits. The program caps the arenas at 2 under a limit (cli.allocator.fewer_arenas_under_a_limit), unless
    the user set MALLOC_ARENA_MAX, which stands (here 64: the limit is hit, and said)."""
    from support.models import export_token_model, toy_token_spec

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    model = export_token_model(spec, tmp_path / "model").path
    assert len(list(model.glob("*.onnx"))) >= 12  # the fast graphs, each a session
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update({"OPENBLAS_NUM_THREADS": "1", **({"MALLOC_ARENA_MAX": arenas} if arenas else {})})
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(model), "--text", "the cat", "--threads", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
                          preexec_fn=_address_space(600_000))
    if arenas is None:
        assert done.returncode == 0 and '"hypotheses"' in done.stdout, done.stderr[-2000:]
    else:
        assert done.returncode == 1 and "onnxruntime could not start the session" in done.stderr, done.stderr[-2000:]


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))  # `ulimit -f 1`


def test_a_file_size_limit_while_training_is_one_line(tmp_path: Path) -> None:
    """A training state the file size limit cuts short: one line naming the file and the limit, and nothing left
    (torch's writer raised 'RuntimeError: [enforce fail at inline_container.cc] unexpected pos' as a traceback,
    and an empty `.partial` directory stayed)."""
    done = subprocess.run([sys.executable, "-m", "cli", "train", "--epochs", "1", "--out", "ck", "--quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=_small_files)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: '{tmp_path / 'ck.partial' / 'train_state.pt'}' could not be written (File too large); free space, "
        "or raise the file size limit (ulimit -f), then rerun"), done.stderr
    assert sorted(tmp_path.iterdir()) == []


def _address_space(kb: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (kb * 1024, kb * 1024))


@pytest.mark.parametrize(("kb", "said"), [
    (400_000, "Error: this command needs PyTorch (torch is installed but could not be loaded: "),
    (600_000, "Error: train: out of memory"),
], ids=["torch-cannot-load", "training-cannot-allocate"])
def test_training_under_a_memory_limit_is_one_line(tmp_path: Path, kb: int, said: str) -> None:
    """Below torch's own size, its import failed and `train` said PyTorch 'is not installed'; a little above it,
    training's allocations ended in a MemoryError or 'RuntimeError: std::bad_alloc' traceback. Around 600 MB the
    run stops in its first epoch, or where even its line could not be made (the fallback line, which names the
    command too: both happened at this size on one Intel Xeon, by the load)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # (OpenBLAS's own pool gives up with a line and exit 1)
    done = subprocess.run([sys.executable, "-m", "cli", "train", "--epochs", "1", "--out", "ck", "--quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=_address_space(kb))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(said), done.stderr[-2000:]
    assert sorted(tmp_path.iterdir()) == []


def _train_hooked(tmp_path: Path, hook: str, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": hook_path(tmp_path, hook)}
    return subprocess.run([sys.executable, "-m", "cli", "train", "--quiet", "--out", "ck", *options], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_run_out_of_memory_in_an_epoch_says_the_state_it_saved(tmp_path: Path) -> None:
    """Out of memory in epoch 3, with epoch 2's state saved: the line said "nothing half-written is left", not that
    the state is there for --resume, which then finishes the run."""
    state = tmp_path / "ck.partial" / "train_state.pt"
    done = _train_hooked(tmp_path, OUT_OF_MEMORY_IN_THE_THIRD_EPOCH, "--epochs", "4")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: train: out of memory during epoch 3; under a memory limit (ulimit -v), raise it; the last saved state "
        f"(of epoch 2) is in {str(state)!r}; rerun with --resume to continue"), done.stderr
    resumed = subprocess.run([sys.executable, "-m", "cli", "train", "--quiet", "--out", "ck", "--epochs", "4",
                              "--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and (tmp_path / "ck" / "weights.pt").is_file(), resumed.stderr[-2000:]


def test_a_checkpoint_out_of_memory_as_it_is_written_says_the_trained_state_is_kept(tmp_path: Path) -> None:
    """The loader finding no room for matplotlib as loss.png is drawn after the last epoch (`ulimit -v` 700-760 MB):
    the line said "nothing half-written is left", though the trained state stays for --resume to write."""
    state = tmp_path / "ck.partial" / "train_state.pt"
    done = _train_hooked(tmp_path, OUT_OF_MEMORY_WRITING_THE_CHECKPOINT, "--epochs", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: train: out of memory while writing the checkpoint after the last epoch; under a memory limit "
        f"(ulimit -v), raise it; {str(tmp_path / 'ck')!r} was not written, the trained state is in {str(state)!r}: "
        "rerun with --resume to write it"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.partial", "hook"] and state.is_file()


def test_no_memory_in_an_exit_callback_adds_nothing_to_the_commands_line(tmp_path: Path) -> None:
    """torch's exit callback imports a module; under `ulimit -v` the import's directory listing failed (ENOMEM),
    and Python printed "Exception ignored in atexit callback" and a traceback after the out-of-memory line."""
    env = {**os.environ, "PYTHONPATH": hook_path(tmp_path, NO_MEMORY_AT_EXIT)}
    done = subprocess.run([sys.executable, "-m", "cli", "--version"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.startswith("seq2onnx, version") and done.stderr == "", done.stderr


def test_a_batch_without_memory_names_its_lines_once_and_the_batch_size_option(tmp_path: Path) -> None:
    """A batch onnxruntime cannot find memory for: its lines named once ('... line 1 to ... line 4000' before), and
    the advice names --batch-size, the batch the user chose."""
    (tmp_path / "big.txt").write_text(("3/3/15 " * 30 + "\n") * 4000)
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--input", "big.txt", "--batch-size",
                           "4000", "--beam", "8", "--threads", "1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, preexec_fn=_address_space(700_000))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --input big.txt lines 1-4000: encoder.onnx: onnxruntime could not run "), last
    assert "Failed to allocate memory" in last, last
    assert last.endswith("; pass a smaller --batch-size (this one was 4000), a narrower --beam (8) or shorter "
                         "inputs"), last
    assert done.stdout == ""


def test_a_search_without_memory_is_the_same_one_line_and_writes_no_output(tmp_path: Path) -> None:
    """numpy's MemoryError in the beam search (64 texts at beam 64, 4,096 tokens with attention) was 'infer: out of
    memory', without the lines or the options that made it; now the runtime's ResourceError, said as onnxruntime's
    is. It is an OSError, which --output's writer (the decode streams into it) must not read as the file that
    'could not be written'."""
    (tmp_path / "in.txt").write_text(("3/3/15 " * 20 + "\n") * 64)
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--input", "in.txt", "--batch-size", "64",
                           "--beam", "64", "--max-len", "4096", "--min-len", "4096", "--attention", "--threads", "1",
                           "--output", "out.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=_address_space(900_000))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --input in.txt lines 1-64: translate_batch (64 texts, beam_size 64): the decode "
                           "needs more memory than this process has free (Unable to allocate "), last
    assert last.endswith("; pass a smaller --batch-size (this one was 64), a narrower --beam (64), a smaller "
                         "--max-len (4096), a smaller --min-len (4096), no --attention or shorter inputs"), last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize(("sources", "target_len", "output", "said", "advice"), [
    (200_000, 10_000, None, "--input: in.npy: greedy_loop.onnx: onnxruntime could not run on inputs of shapes ",
     "; pass fewer or shorter sources, or a smaller --target-len (this one was 10000)"),
    (50_000, 100, None, "the results (10000000 numbers) need more memory as JSON text than this process has free",
     "; write them with --output FILE.npy or FILE.npz (binary), or pass fewer sources or a smaller --target-len"),
    (50_000, 100, "out.json", "the results (10000000 numbers)", "or a smaller --target-len"),
], ids=["decode", "json", "json-output"])
def test_point_results_without_memory_name_the_option_that_sizes_them(tmp_path: Path, sources: int, target_len: int,
                                                                      output: str | None, said: str,
                                                                      advice: str) -> None:
    """A point decode the memory could not hold advised 'a smaller batch', which point infer has no option for (the
    --target-len it was given made it); results that fit decoded but not as JSON text were 'infer: out of memory',
    naming nothing to change (a .npy --output holds them)."""
    import numpy as np

    np.save(tmp_path / "in.npy", np.random.default_rng(0).uniform(-1, 1, (sources, 2, 2)).astype(np.float32))
    args = ["--output", output] if output else []
    done = subprocess.run([sys.executable, "-m", "cli", "infer", str(SQUARES), "--input", "in.npy", "--target-len",
                           str(target_len), "--threads", "1", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, preexec_fn=_address_space(900_000))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: {said}") and last.endswith(advice), last
    assert done.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]


def _onnxruntime_own(line: str) -> bool:
    """Whether a line of stderr is onnxruntime's own log, which it writes as it fails (its schema registration's, a
    session's error, or its environment's warning that the provider bridge could not start: coloured and dated)."""
    return line.startswith("Schema error: ") or "[E:onnxruntime:" in line or "[W:onnxruntime:" in line


def _frames(stderr: str) -> list[str]:
    """faulthandler's stack of a crashed (or SIGABRTed) process, innermost first; [] where it printed none."""
    stack = stderr.partition("most recent call first):")[2].splitlines()
    return [line.strip() for line in stack if line.strip().startswith("File ")] if "Fatal Python error" in stderr \
        else []


def _inside_onnxruntime(stderr: str) -> bool:
    """Whether the stack starts (innermost first, past the import machinery) in onnxruntime's own package: its module
    start-up or session initialisation."""
    files = [line for line in _frames(stderr) if "<frozen" not in line]
    return bool(files) and f"{os.sep}onnxruntime{os.sep}" in files[0]


def _crashed_outside_our_code(stderr: str) -> bool:
    """Whether a crash's stack starts in onnxruntime's package (out of memory part-way) or in CPython's import
    machinery itself (`<frozen importlib._bootstrap>`: a module being found or loaded, before any line of it ran; a
    SIGSEGV at 158,750 KB on an Intel Xeon, with the code before this change too)."""
    frames = _frames(stderr)
    return bool(frames) and (frames[0].startswith('File "<frozen importlib._bootstrap') or _inside_onnxruntime(stderr))


def _infer_limited(kb: int, env: dict[str, str]) -> tuple[int, str, str, bool]:
    """`infer` of the dates model under `ulimit -v` kb: (status, stdout, stderr, hung). One that is still running
    after HANG_S is sent SIGABRT, so that faulthandler says where it was."""
    with subprocess.Popen([sys.executable, "-m", "cli", "infer", str(DATES), "--text", "3/3/15", "--threads", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          preexec_fn=_address_space(kb)) as proc:
        try:
            out, err = proc.communicate(timeout=HANG_S)
            return proc.returncode, out, err, False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=60)
            return proc.returncode, out, err, True


HANG_S = 45  # a decode under a limit ends in ~1 s on an idle machine


def test_infer_under_a_tight_memory_limit_is_one_line_at_every_size() -> None:
    """From the limit where onnxruntime's import fails to where the model loads: onnxruntime's module start-up
    throwing std::bad_alloc (an ImportError) was a traceback; so were a MemoryError in click's own clean-up of a
    command that had run out (the one line could not be made), CPython's import out of memory part-way (a SystemError
    or a SyntaxError of our own module) and a MemoryError in the threading module's shut-down; and glibc aborted
    ('libgcc_s.so.1 must be installed for unwinding to work', SIGABRT, all output lost) where it first needed its
    unwinder with no room left to load it. Swept in fine steps, as where each lands moves with the libraries' sizes.

    What is not ours: onnxruntime's start-up and session initialisation are not safe against a failed allocation
    everywhere, and at a few sizes it crashes (SIGSEGV) inside itself, as CPython's import machinery does at others,
    or spins in its import until killed; those are let be, and only those: the crash's stack (faulthandler) must
    start in onnxruntime's package or in the import machinery, a hang's in onnxruntime's package."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    seen = []
    for kb in range(120_000, 205_000, 1_250):
        code, out, err, hung = _infer_limited(kb, env)
        said = (kb, code, hung, err[-3000:])
        assert "Traceback" not in err and "libgcc_s" not in err, said
        if hung:  # onnxruntime's import spinning out of memory (159,250 KB on an Intel Xeon, one run in three)
            assert _inside_onnxruntime(err), said
        elif code < 0:
            assert _crashed_outside_our_code(err), said
        elif code == 0:
            assert "2015-03-03" in out, (kb, out)
        else:
            lines = [line for line in err.splitlines() if line and not _onnxruntime_own(line)]
            assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), said
        seen.append(code)
    assert {0, 1} <= set(seen) and seen.count(1) + seen.count(0) >= 0.9 * len(seen), seen


def test_a_thread_that_ends_as_the_program_exits_out_of_memory_does_not_abort_it() -> None:
    """Python ends a daemon thread that wakes during the interpreter's shut-down by pthread_exit, and glibc then
    loads its unwinder (libgcc_s); with the address space spent it could not, and aborted the process (SIGABRT,
    'libgcc_s.so.1 must be installed for pthread_exit to work'), its exit status and unflushed output lost. The
    program has glibc load it at start (cli.allocator.unwinder_loaded): the process ends with its own status."""
    script = """if True:
        import resource, sys, threading, time
        from cli.allocator import unwinder_loaded
        print(unwinder_loaded())
        threading.Thread(target=lambda: [time.sleep(0.001) for _ in iter(int, 1)], daemon=True).start()
        room = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize() + 256 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))
        held = []
        try:
            while True:
                held.append(bytearray(4096))
        except MemoryError:
            sys.exit(3)
    """
    for _ in range(3):  # without the unwinder loaded first, every run here aborted
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 3 and done.stdout == "True\n" and done.stderr == "", (done.returncode, done.stderr)


def test_a_command_out_of_memory_ends_on_its_line_with_no_memory_left_after_it() -> None:
    """Once the command's out-of-memory line was written, the SystemExit after it still had to travel up through
    click's frames and the interpreter's shut-down, allocating on the way (a traceback entry per frame): with no
    memory left that failed, and the line was followed by a MemoryError traceback (CI, 151,250 KB of `ulimit -v`)
    or by the program's second line for no memory at all. Here the address space is spent just after the line is
    written: the process ends on it, with status 1."""
    script = """if True:
        import resource, sys, click
        import cli.main

        @click.command()
        def hungry():
            bytearray(1 << 50)  # a real MemoryError: no process has a petabyte

        class SpendAllAfterTheLine:  # stderr: once the line is out, the address space is spent
            def __init__(self, stream):
                self.stream, self.held = stream, ()
            def write(self, text):
                written = self.stream.write(text)
                self.stream.flush()
                if "out of memory" in text:
                    pages = int(open("/proc/self/statm").read().split()[0])
                    resource.setrlimit(resource.RLIMIT_AS, (pages * resource.getpagesize(), resource.RLIM_INFINITY))
                    for size in (4096, 64, 0):  # a chain, not a list: a list's own growth fails first, big
                        try:
                            while True:
                                self.held = (bytes(size), self.held)
                        except MemoryError:
                            pass
                return written
            def flush(self):
                self.stream.flush()
            def __getattr__(self, name):
                return getattr(self.stream, name)

        cli.main.LAZY_COMMANDS["hungry"] = ("__main__", "hungry")
        sys.stderr = SpendAllAfterTheLine(sys.stderr)
        cli.main.entry(["hungry"])
    """
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
        assert lines[0].startswith("Error: hungry: out of memory; under a memory limit (ulimit -v)"), done.stderr
