"""Training on several processes (torchrun, DDP over gloo), with real processes on this machine:
- two ranks keep identical parameters after every step, equal (float64, 1e-10) to one process training on both
  ranks' rows at once, with the same globally reduced step losses and validation figures;
- `seq2onnx train --nproc-per-node 2` writes the same checkpoint files as one process, which export (parity),
  verify and infer take as they are, and which a single process resumes;
- ranks that leave at different times exit cleanly, having met (a rank that never comes is named);
- a killed rank stops every rank at once with a clear message, keeps the last saved state, and --resume completes;
  Ctrl-C stops every rank with exit 130;
- two launchers meeting at a c10d rendezvous on 127.0.0.1 (two "nodes": `seq2onnx train --nnodes 2` and the
  documented `torchrun ... -m training`) train one model;
- the launcher's own checks: options forwarded to every rank as given, refused inside torchrun.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import ddp_worker
import pytest
import torch

from cli.run_logs import LOGS_PREFIX, sweep_torchrun_logs
from runtime.contract import CHECKPOINT_STATE_FILE, partial_dir
from runtime.defaults import max_threads
from runtime.vocab import PAD
from training.checkpoint import TOKEN_CHECKPOINT_FILES
from training.torchrun import LAUNCH_ENV, partial_launch_env
from training.train_state import load_train_state

from support.processes import alive, default_stops
from support.stop_hooks import AFTER_PUBLISH, BEFORE_THE_FIRST_SAVE, hook_path

pytestmark = pytest.mark.ddp

PARAMS_ATOL = 1e-10  # float64: what differs is only the order of summation (measured: <= 4e-13)
STOP_WITHIN_S = 60  # a killed rank: the launcher and every other rank gone within this
RUN_TIMEOUT_S = 300
KINDS = ["gru", "lstm-additive", "transformer", "points", "points-dot"]  # as tests/ddp_worker.py builds them
SMALL_REVERSE = ("--data", "reverse", "--hidden-dim", "32", "--embedding-dim", "16", "--eval-beam", "0", "--quiet")


def seq2onnx(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`args` to the end, in a session of its own: a timeout kills the launcher's whole group, not the launcher
    alone (torchrun's ranks, in sessions of their own, die with it once they have joined: `start`)."""
    with subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True, preexec_fn=default_stops) as proc:
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launched:
    """A command in its own process group, its output in a file; the group is killed if the test leaves it."""

    def __init__(self, args: list[str], cwd: Path, log: Path) -> None:
        self.log = log
        self.workers: set[int] = set()
        temp = cwd / "tmp"  # a launcher killed outright cannot remove its torchrun log directory: here, not in /tmp
        temp.mkdir(exist_ok=True)
        with open(log, "w") as f:
            self.proc = subprocess.Popen(args, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=default_stops,  # some tests stop it with Ctrl-C
                                         env={**os.environ, "TMPDIR": str(temp)})

    def output(self) -> str:
        return self.log.read_text()

    def ranks(self) -> dict[int, int]:
        """{rank: pid} of the launcher's worker processes (each in a session of its own: torchrun starts them so)."""
        found = {}
        for child in _children(self.proc.pid):
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for entry in env:
                if entry.startswith(b"RANK="):
                    found[int(entry[5:])] = child
        self.workers |= set(found.values())
        return found

    def exit_code(self, timeout: float) -> int:
        """The command's exit status; if it is still running after `timeout`, a failure that shows its output and
        what each of its processes is doing (state and kernel wait channel), which a bare TimeoutExpired hid."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.ranks()
            seen = []
            for pid in [self.proc.pid, *_children(self.proc.pid), *self.workers]:
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{pid}/stat").read_text().split()
                    wchan = Path(f"/proc/{pid}/wchan").read_text()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                    seen.append(f"{pid} {stat[2]} {wchan} {cmd}")
            pytest.fail(f"still running {timeout} s after the signal:\n" + "\n".join(seen) + "\n" + self.output())

    def all_gone(self) -> bool:
        """Neither the launcher's process group nor any worker seen is left."""
        return not _alive(-self.proc.pid) and not any(_alive(pid) for pid in self.workers)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.ranks()
        for pid in [-self.proc.pid, *self.workers]:  # workers first would leave torchrun to restart them
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):  # gone between the look and the kill
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)


def _alive(pid: int) -> bool:
    """A process (or, negative, a process group) exists and is not a zombie."""
    if pid > 0:
        return alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):  # the process, or one of its threads, ended while being read
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Any]:
    started: list[Launched] = []

    def start(args: list[str], name: str = "run") -> Launched:
        started.append(Launched(args, tmp_path, tmp_path / f"{name}.log"))
        return started[-1]

    yield start
    try:
        for each in started[:-1]:
            with contextlib.suppress(Exception):  # one launcher's trouble must not leave the next running
                each.close()
    finally:
        if started:
            started[-1].close()


def past_its_checks(launcher: Launched) -> None:
    """Wait until a launcher of several machines has made its checks (which briefly lock --out) and waits for the
    other machines; a second launcher into the same --out started before would meet that lock."""
    wait_for(lambda: "waiting for 2 machines" in launcher.output() or launcher.proc.poll() is not None, 120,
             "the first launcher to finish its checks")


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ---- two ranks against one process --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp_record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/ddp_worker.py under torchrun, 2 ranks: per step, both ranks' parameters, rows and losses."""
    out = tmp_path_factory.mktemp("ddp") / "record.pt"
    worker = Path(__file__).with_name("ddp_worker.py")
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "--log-dir", str(out.parent / "logs"), str(worker), str(out)], cwd=out.parent,
                 env={**os.environ, "OMP_NUM_THREADS": "1"})  # its logs here, not a /tmp/torchelastic_* left
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def reference(ddp_record: dict[str, Any]) -> dict[str, Any]:
    """One process replaying each step on the union of both ranks' rows: parameters, losses, validation."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        replayed = {}
        for name, trainer in ddp_worker.models().items():
            trainer.model.train()
            steps = []
            for step in ddp_record[name]["steps"]:
                loss = trainer.train_step(torch.tensor(step["rows"][0] + step["rows"][1]))
                steps.append({"params": ddp_worker.flat(trainer.model), "loss": loss})
            replayed[name] = {"steps": steps, "validation": ddp_worker.validate(trainer)}
        return replayed
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("kind", KINDS)
def test_ranks_hold_identical_parameters_after_every_step(ddp_record: dict[str, Any], kind: str) -> None:
    steps = ddp_record[kind]["steps"]
    assert ddp_record["world_size"] == 2 and len(steps) == ddp_worker.STEPS
    for number, step in enumerate(steps):
        first, second = step["params"]
        assert torch.equal(first, second), f"{kind}: ranks differ after step {number + 1}"
        assert step["losses"][0] == step["losses"][1], f"{kind}: ranks report different losses"
        # disjoint shards, but for the one row DistributedSampler repeats to even them out (37 rows, 2 ranks)
        assert len(set(step["rows"][0]) & set(step["rows"][1])) <= 1, f"{kind}: ranks trained on the same rows"


@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_train_as_one_process_on_the_combined_batch(ddp_record: dict[str, Any], reference: dict[str, Any],
                                                              kind: str) -> None:
    for number, (ours, theirs) in enumerate(zip(ddp_record[kind]["steps"], reference[kind]["steps"])):
        torch.testing.assert_close(ours["params"][0], theirs["params"], atol=PARAMS_ATOL, rtol=0,
                                   msg=lambda m, step=number + 1: f"{kind}, step {step}: {m}")
        (total, items), (ref_total, ref_items) = ours["losses"][0], theirs["loss"]
        assert items == ref_items  # the global token (coordinate) count of the step
        assert total == pytest.approx(ref_total, rel=1e-12)
    # token models: accuracies (exact); points: an MSE evaluated in float32, summed in another order
    assert ddp_record[kind]["validation"] == pytest.approx(reference[kind]["validation"], rel=1e-6)


def test_uneven_padding_across_ranks_is_normalised_globally(ddp_record: dict[str, Any]) -> None:
    """The case that separates a global token count from per-rank means: ranks with different token counts."""
    batcher = ddp_worker.models()["gru"].batcher
    tokens = [[int((batcher.batch(torch.tensor(rows)).target_out != PAD).sum()) for rows in step["rows"]]
              for step in ddp_record["gru"]["steps"]]
    assert any(first != second for first, second in tokens), tokens  # so the comparison above tells them apart


def test_rank_shards_follow_the_distributed_sampler() -> None:
    from training.distributed import Dist

    shards = [Dist(rank, 3, rank).shard(10, seed=7, epoch=2) for rank in range(3)]
    assert all(len(s) == 4 for s in shards)  # ceil(10 / 3), padded
    assert set(torch.cat(shards).tolist()) == set(range(10))
    assert not torch.equal(Dist(0, 3, 0).shard(10, seed=7, epoch=3), shards[0])  # set_epoch reshuffles
    assert torch.equal(Dist(0, 3, 0).shard(10, seed=7, epoch=2), shards[0])  # and only the epoch does


def test_a_rank_that_finds_a_peer_gone_ignores_the_sigterm_that_follows() -> None:
    """torchrun stops a rank with SIGTERM as it sees another die; a rank that has itself found the peer gone is on
    its way out saying why, and that SIGTERM must not replace its message (it did, once, in CI)."""
    code = """
import os, signal, sys
from training.distributed import Dist, PeerFailedError, Terminated

def terminated(signum, frame):
    raise Terminated()

signal.signal(signal.SIGTERM, terminated)

def collective():
    raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")

try:
    Dist(0, 2, 0).talk(collective)
except PeerFailedError as err:
    os.kill(os.getpid(), signal.SIGTERM)
    print("still saying:", err)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "still saying: another process of the run stopped (Connection closed by peer " \
                                  "[127.0.0.1]:29500)"


# ---- the command -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ddp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """`seq2onnx train --nproc-per-node 2` on the built-in toy translation, 3 epochs."""
    work = tmp_path_factory.mktemp("ddp-cli")
    (work / "tmp").mkdir()  # the launcher's TMPDIR: test_the_launcher_leaves_no_run_directory_in_...
    result = run(seq2onnx("train", "--data", "toy-translation", "--epochs", "3", "--eval-beam", "0", "--out", "ckpt",
                          "--nproc-per-node", "2"), cwd=work, env={**os.environ, "TMPDIR": str(work / "tmp")})
    assert result.returncode == 0, result.stderr[-3000:]
    return work / "ckpt", result


def test_the_launcher_leaves_no_run_directory_in_the_temp_directory(ddp_checkpoint: Any) -> None:
    """torchrun makes a log directory (its ranks' error files) in the temp directory and never removes it: a
    /tmp/torchelastic_* a run. The launcher gives it one of its own and removes that. (What stays is shared by every
    run, not one a run: torch's compile cache directory, onnxruntime's 51-byte .ses file.)"""
    ckpt, _ = ddp_checkpoint
    left = sorted(p.name for p in (ckpt.parent / "tmp").iterdir())
    assert [name for name in left if name.startswith(("torchelastic_", "seq2onnx-torchrun-"))] == [], left


def test_two_processes_write_one_checkpoint_of_the_usual_files(ddp_checkpoint: Any) -> None:
    ckpt, result = ddp_checkpoint
    assert {p.name for p in ckpt.iterdir()} == TOKEN_CHECKPOINT_FILES  # what one process writes
    assert not partial_dir(ckpt).exists()
    assert [p.name for p in ckpt.parent.iterdir() if p.name.startswith(".ckpt.") and p.suffix != ".lock"] == []
    meta = json.loads((ckpt / "spec.json").read_text())
    assert meta["distributed"] == {"world_size": 2, "backend": "gloo", "batch_size_per_process": 9,
                                   "global_batch_size": 18}
    history = json.loads((ckpt / "history.json").read_text())
    assert [len(v) for v in history.values()] == [3, 3, 3]
    assert result.stdout.count("checkpoint written to") == 1  # rank 0 alone reports
    assert result.stdout.count("test = training set (9)") == 1
    assert "exact=" in result.stderr  # rank 0's progress bar
    state = load_train_state(ckpt / CHECKPOINT_STATE_FILE)
    assert state["world_size"] == 2 and state["epoch"] == 3


def test_a_ddp_checkpoint_exports_verifies_and_infers(ddp_checkpoint: Any, tmp_path: Path) -> None:
    ckpt, _ = ddp_checkpoint
    exported = run(seq2onnx("export", str(ckpt), "--out", "model"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "parity" in (exported.stdout + exported.stderr).lower()
    verified = run(seq2onnx("verify", str(ckpt), "model"), cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr[-3000:]
    inferred = run(seq2onnx("infer", "model", "--text", "the cat sleeps"), cwd=tmp_path)
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    record = json.loads(inferred.stdout.splitlines()[0])
    assert record["source"] == "the cat sleeps" and len(record["hypotheses"]) == 1


def test_one_process_resumes_a_two_process_checkpoint(ddp_checkpoint: Any, tmp_path: Path) -> None:
    ckpt, _ = ddp_checkpoint
    copy = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(ckpt), str(copy)], check=True)
    before = json.loads((copy / "history.json").read_text())
    result = run(seq2onnx("train", "--resume", "--out", "ckpt", "--epochs", "4", "--quiet"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming a run saved by 2 process(es) on 1: the global batch goes from 18 to 9" in result.stdout
    after = json.loads((copy / "history.json").read_text())
    assert {k: v[:3] for k, v in after.items()} == before and len(after["train_loss"]) == 4
    assert "distributed" not in json.loads((copy / "spec.json").read_text())


# ---- leaving ----------------------------------------------------------------------------------------------

def leave_worker(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """tests/ddp_leave_worker.py under torchrun, 2 ranks."""
    worker = Path(__file__).with_name("ddp_leave_worker.py")
    return run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--log-dir", str(cwd / "logs"), str(worker), *args], cwd=cwd,
               env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_rank_that_leaves_while_its_gloo_worker_lags_exits_cleanly(tmp_path: Path) -> None:
    """The exit race opened on purpose: rank 1's gloo worker starved (it runs only while rank 1's main thread
    waits) and rank 0 two seconds late. Leaving without waiting for the worker, rank 1 aborts at interpreter
    shutdown ('terminate called without an active exception'); `leave` waits for it, and for rank 0."""
    result = leave_worker("--starve-rank", "1", "--lag-rank", "0", "--lag", "2", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "terminate called" not in output and "exitcode" not in output, output[-3000:]
    assert "rank 0 left" in output and "rank 1 left" in output
    # what makes the wait sufficient: one worker, which drops each collective before it takes the next
    assert "rank 0: gloo workers 1" in output and "rank 1: gloo workers 1" in output


def test_a_rank_gone_before_the_end_is_named_by_the_others(tmp_path: Path) -> None:
    result = leave_worker("--ending", "vanish", cwd=tmp_path)
    assert "rank 0: rank 1 of 2 stopped before the end of the run (" in result.stdout, result.stdout + result.stderr
    assert "terminate called" not in result.stderr


def test_a_rank_that_never_comes_is_named_when_the_wait_runs_out(tmp_path: Path) -> None:
    result = leave_worker("--ending", "stuck", "--timeout", "1.5", cwd=tmp_path)
    expected = "rank 0: rank 1 of 2 did not reach the end of the run within 1.5 s ("
    assert expected in result.stdout, result.stdout + result.stderr
    assert result.returncode != 0
    assert "rank 1 left" not in result.stdout  # stuck for 10 minutes: torchrun stopped it when rank 0 failed


# ---- failures ---------------------------------------------------------------------------------------------

def test_a_usage_error_met_by_the_ranks_is_said_once_with_its_status(ddp_checkpoint: Any, tmp_path: Path) -> None:
    ckpt, _ = ddp_checkpoint
    copy = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(ckpt), str(copy)], check=True)
    result = run(seq2onnx("train", "--resume", "--out", "ckpt", "--epochs", "3", "--nproc-per-node", "2"),
                 cwd=tmp_path)  # options are checked against the saved state by rank 0
    assert result.returncode == 2, result.stderr
    assert "already trained for 3 epochs; pass --epochs 4 or more" in result.stderr
    assert result.stderr.count("Error") == 1, result.stderr  # rank 0's, without the launcher's or torchrun's


def test_a_data_error_met_by_the_ranks_is_said_once(tmp_path: Path) -> None:
    (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n")
    result = run(seq2onnx("train", "--data", "bad.tsv", "--out", "ckpt", "--nproc-per-node", "2"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Error: --data: bad.tsv: 1 bad entry" in result.stderr and "line 2 has 0 tabs" in result.stderr
    assert result.stderr.count("Error") == 1, result.stderr
    assert "training failed" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ckpt").exists()


def _state_saved(out: Path) -> bool:
    return (partial_dir(out) / CHECKPOINT_STATE_FILE).is_file()


def test_a_killed_rank_stops_the_run_and_resume_completes_it(launched: Any, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--epochs", "3", "--out", "ckpt", "--nproc-per-node", "2"))
    wait_for(lambda: _state_saved(out) or run_.proc.poll() is not None, 240, "the first saved epoch")
    assert run_.proc.poll() is None, run_.output()
    time.sleep(0.5)  # into epoch 2
    ranks = run_.ranks()
    assert sorted(ranks) == [0, 1], ranks
    killed = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    code = run_.proc.wait(STOP_WITHIN_S)
    assert time.monotonic() - killed < STOP_WITHIN_S
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    output = run_.output()
    assert code == 1, output
    assert f"rank 1 (pid {ranks[1]}) was killed by SIGKILL" in output
    assert "every process of the run has stopped" in output and "rerun with --resume" in output
    assert "Traceback" not in output
    # the last good state is whole; nothing else was written
    state = load_train_state(partial_dir(out) / CHECKPOINT_STATE_FILE)
    assert state["epoch"] >= 1 and state["world_size"] == 2
    assert sorted(p.name for p in partial_dir(out).iterdir()) == [CHECKPOINT_STATE_FILE]
    assert not out.exists()
    resumed = run(seq2onnx("train", "--resume", "--out", "ckpt", "--nproc-per-node", "2", "--quiet"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(json.loads((out / "history.json").read_text())["train_loss"]) == 3
    assert not partial_dir(out).exists()


def test_with_max_restarts_a_killed_rank_is_replaced_and_the_run_resumes_itself(launched: Any,
                                                                                tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--epochs", "2", "--out", "ckpt", "--nproc-per-node", "2",
                             "--max-restarts", "1"))
    wait_for(lambda: _state_saved(out) or run_.proc.poll() is not None, 240, "the first saved epoch")
    assert run_.proc.poll() is None, run_.output()
    os.kill(run_.ranks()[1], signal.SIGKILL)
    assert run_.proc.wait(RUN_TIMEOUT_S) == 0, run_.output()
    output = run_.output()
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    assert "torchrun started the processes again (restart 1): resuming from the last saved state" in output
    for line in output.splitlines():  # rank 0's line before the restart: it resumes by itself
        assert "rerun with --resume" not in line or "unless torchrun starts the processes again" in line, line
    assert "Error" not in output or "unless torchrun starts the processes again" in output, output
    assert output.count("checkpoint written to") == 1
    assert len(json.loads((out / "history.json").read_text())["train_loss"]) == 2
    assert not partial_dir(out).exists()


def test_a_busy_out_is_refused_and_the_ranks_of_a_killed_launcher_stop_too(launched: Any, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ckpt"
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--epochs", "50", "--out", "ckpt", "--nproc-per-node", "2"))
    wait_for(lambda: _state_saved(out) or run_.proc.poll() is not None, 240, "the first saved epoch")
    assert run_.proc.poll() is None, run_.output()
    assert sorted(run_.ranks()) == [0, 1]
    second = run(seq2onnx("train", *SMALL_REVERSE, "--out", "ckpt", "--nproc-per-node", "2"), cwd=tmp_path)
    assert second.returncode == 1, second.stderr
    assert "another seq2onnx process is writing it" in second.stderr and "interrupted run" not in second.stderr
    os.kill(run_.proc.pid, signal.SIGKILL)  # the launcher alone, which can then stop nobody
    run_.proc.wait(10)
    wait_for(run_.all_gone, STOP_WITHIN_S, "the ranks of the killed launcher to exit")
    said = run_.output()
    assert f"Error: train: stopped: its launcher (pid {run_.proc.pid}) died during epoch" in said, said
    assert said.count("Error") == 1, said
    assert load_train_state(partial_dir(out) / CHECKPOINT_STATE_FILE)["epoch"] >= 1
    # its torchrun log directory stayed behind; the next run's launcher removes it (as sweep_torchrun_logs here)
    left = [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith(LOGS_PREFIX)]
    assert len(left) == 1, left
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert sweep_torchrun_logs() == left


@pytest.mark.parametrize(("sent", "code", "rank_says", "launcher_says"), [
    # a terminal's Ctrl-C goes to the foreground group (torchrun passes it on to the workers, in sessions of their own)
    (signal.SIGINT, 130, "interrupted during epoch", "Error: train: interrupted; every process of the run has stopped"),
    # a service manager's stop goes to the launcher, which stops the workers with SIGTERM
    (signal.SIGTERM, 143, "stopped by SIGTERM", "Error: train: stopped by SIGTERM; every process of the run has stopped"),
    # a closed terminal's hang-up goes to the foreground group too: a stop as SIGTERM's (it was exit 130, "interrupted")
    (signal.SIGHUP, 143, "stopped by SIGTERM", "Error: train: stopped by SIGTERM; every process of the run has stopped"),
], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_signal_stops_every_rank_with_its_exit_status(launched: Any, tmp_path: Path, sent: int, code: int,
                                                        rank_says: str, launcher_says: str) -> None:
    out = tmp_path / "ckpt"
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--epochs", "4", "--out", "ckpt", "--nproc-per-node", "2"))
    wait_for(lambda: _state_saved(out) or run_.proc.poll() is not None, 240, "the first saved epoch")
    assert run_.proc.poll() is None, run_.output()
    assert sorted(run_.ranks()) == [0, 1]
    if sent in (signal.SIGINT, signal.SIGHUP):
        os.killpg(run_.proc.pid, sent)
    else:
        os.kill(run_.proc.pid, sent)
    status = run_.proc.wait(STOP_WITHIN_S)
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    output = run_.output()
    assert status == code, output
    assert f"Error: train: {rank_says}" in output and "rerun with --resume" in output  # rank 0
    assert "rank 1" not in output  # the other ranks stop quietly: the user stopped them
    assert launcher_says in output and output.count("Error") == 2, output
    assert f"{launcher_says}; the last saved state is in " in output, output  # what is kept when it stops
    assert "Traceback" not in output
    assert load_train_state(partial_dir(out) / CHECKPOINT_STATE_FILE)["epoch"] >= 1
    assert sorted(p.name for p in partial_dir(out).iterdir()) == [CHECKPOINT_STATE_FILE]
    assert not out.exists()


def test_a_run_stopped_once_its_checkpoint_is_written_says_so(launched: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher said "no training state was saved yet; rerun to start again" of a run it had finished."""
    monkeypatch.setenv("PYTHONPATH", hook_path(tmp_path, AFTER_PUBLISH))
    out = tmp_path / "ckpt"
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--epochs", "1", "--out", "ckpt", "--nproc-per-node", "2"))
    status = run_.proc.wait(RUN_TIMEOUT_S)
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    output = run_.output()
    assert status == 143, output
    assert output.strip().splitlines()[-1] == ("Error: train: stopped by SIGTERM; every process of the run has "
                                               f"stopped; {str(out)!r} was written: the run is complete"), output
    assert "no training state" not in output and "rerun" not in output and "Traceback" not in output
    assert len(json.loads((out / "history.json").read_text())["train_loss"]) == 1
    assert not partial_dir(out).exists()


def test_a_resume_that_extends_a_finished_run_stopped_before_a_save_says_out_is_as_it_was(
        launched: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "no training state was saved yet; rerun to start again", of a checkpoint that a rerun without
    --resume refuses to replace (found by a fresh walk)."""
    out = tmp_path / "ckpt"
    assert run(seq2onnx("train", *SMALL_REVERSE, "--epochs", "1", "--out", "ckpt"), cwd=tmp_path).returncode == 0
    before = (out / "weights.pt").read_bytes()
    monkeypatch.setenv("PYTHONPATH", hook_path(tmp_path, BEFORE_THE_FIRST_SAVE))
    run_ = launched(seq2onnx("train", *SMALL_REVERSE, "--resume", "--epochs", "3", "--out", "ckpt",
                             "--nproc-per-node", "2"))
    status = run_.proc.wait(RUN_TIMEOUT_S)
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    output = run_.output()
    assert status == 143, output
    assert output.strip().splitlines()[-1] == ("Error: train: stopped by SIGTERM; every process of the run has "
                                               f"stopped; {str(out)!r} is as it was; rerun with --resume to extend "
                                               "it"), output
    assert "no training state" not in output and "Traceback" not in output
    assert (out / "weights.pt").read_bytes() == before and not partial_dir(out).exists()


# ---- several machines ---------------------------------------------------------------------------------------

def test_two_nodes_meet_at_a_c10d_rendezvous(launched: Any, tmp_path: Path) -> None:
    """Two launchers of one process each, as two machines would run them: ours and the documented torchrun line."""
    endpoint = f"127.0.0.1:{free_port()}"
    common = ("--data", "toy-translation", "--epochs", "2", "--eval-beam", "0", "--quiet", "--out", "ckpt")
    first = launched(seq2onnx("train", *common, "--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", endpoint,
                              "--rdzv-id", "pair"), "first")
    second = launched([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                       "--log-dir", str(tmp_path / "logs"), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                       "--rdzv-id", "pair", "-m", "training",
                       *common], "second")
    assert first.proc.wait(RUN_TIMEOUT_S) == 0, first.output()
    assert second.proc.wait(RUN_TIMEOUT_S) == 0, second.output()
    meta = json.loads((tmp_path / "ckpt" / "spec.json").read_text())
    assert meta["distributed"]["world_size"] == 2
    said = first.output() + second.output()
    assert said.count("checkpoint written to") == 1
    # the machine without rank 0 says what it runs, and where the checkpoint goes
    assert said.count("this machine runs rank 1 of 2; rank 0 shows the progress and writes") == 1
    assert said.count("training finished on this machine; rank 0 wrote") == 1


@pytest.mark.parametrize(("first_only", "option"), [
    (("--lr", "0.001", "--nproc-per-node", "1"), "--lr"),
    (("--nproc-per-node", "2"), "--nproc-per-node"),  # torchrun would take it: 3 ranks, a global batch not asked for
], ids=["lr", "nproc-per-node"])
def test_machines_started_with_different_options_are_refused(launched: Any, tmp_path: Path, first_only: tuple,
                                                             option: str) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    common = ("train", *SMALL_REVERSE, "--out", "ckpt", "--threads", "1", "--nnodes", "2", "--rdzv-endpoint",
              endpoint)
    first = launched(seq2onnx(*common, *first_only), "first")
    past_its_checks(first)
    second = launched(seq2onnx(*common, "--nproc-per-node", "1"), "second")
    codes = [first.proc.wait(RUN_TIMEOUT_S), second.proc.wait(RUN_TIMEOUT_S)]
    assert codes == [2, 2], first.output() + second.output()  # a usage mistake, on both machines
    for machine in (first, second):  # each machine says it, once
        said = machine.output()
        assert said.count(f"started with different options: {option} is") == 1, said
        assert "Traceback" not in said
    assert not (tmp_path / "ckpt").exists() and not partial_dir(tmp_path / "ckpt").exists()


def test_ctrl_c_before_the_first_epoch_is_said_once(launched: Any, tmp_path: Path) -> None:
    """Ctrl-C while the ranks load their data (a large file keeps them there): rank 0 says it, the other rank
    leaves quietly, and the launcher says nothing was kept."""
    rng = random.Random(0)
    lines = (" ".join(rng.choice("0123456789") for _ in range(rng.randint(3, 8))) for _ in range(100_000))
    (tmp_path / "big.tsv").write_text("".join(f"{s}\t{s[::-1]}\n" for s in lines))
    run_ = launched(seq2onnx("train", "--data", "big.tsv", "--hidden-dim", "16", "--embedding-dim", "8",
                             "--eval-beam", "0", "--quiet", "--epochs", "2", "--out", "ckpt", "--nproc-per-node", "2"))
    wait_for(lambda: any(tmp_path.glob(".ckpt*lock")) or run_.proc.poll() is not None, 120, "rank 0's lock")
    run_.ranks()
    os.killpg(run_.proc.pid, signal.SIGINT)
    assert run_.exit_code(STOP_WITHIN_S) == 130, run_.output()
    wait_for(run_.all_gone, 10, "every process of the run to exit")
    output = run_.output()
    ranks_said = [line for line in output.splitlines() if line.startswith("Error: ") and "every process" not in line]
    assert len(ranks_said) <= 1, output  # rank 0's line (none when it stopped before its handlers were in place)
    assert "Error: train: interrupted; every process of the run has stopped; no training state was saved yet" in output
    assert "Traceback" not in output


def test_interrupting_the_rendezvous_host_stops_the_other_machine_with_one_line(launched: Any,
                                                                                 tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    common = ("train", *SMALL_REVERSE, "--epochs", "50", "--out", "ckpt", "--nproc-per-node", "1", "--nnodes", "2",
              "--rdzv-endpoint", endpoint)
    host = launched(seq2onnx(*common), "host")
    past_its_checks(host)
    other = launched(seq2onnx(*common), "other")
    wait_for(lambda: _state_saved(tmp_path / "ckpt") or host.proc.poll() is not None, 240, "the first saved epoch")
    assert host.proc.poll() is None and other.proc.poll() is None, host.output() + other.output()
    host.ranks(), other.ranks()
    os.killpg(host.proc.pid, signal.SIGINT)
    assert host.proc.wait(STOP_WITHIN_S) == 130, host.output()
    assert other.proc.wait(STOP_WITHIN_S) == 1, other.output()
    wait_for(lambda: host.all_gone() and other.all_gone(), 10, "every process of both machines to exit")
    said = other.output()
    # Which notices first: rank 1, its gloo connection to rank 0 closed, or its launcher, the rendezvous store
    # (held by the host's launcher) gone. Under load either can; both say it in one line, with what was kept.
    assert ("Error: rank 1: another process of the run stopped" in said
            or f"Error: the rendezvous at {endpoint} failed: " in said), said
    assert "Traceback" not in said and "frame #" not in said and "Exception raised from" not in said
    assert len(said.splitlines()) <= 4, said  # the wait notice, rank 1's line, the launcher's line (+ torchrun's)
    assert load_train_state(partial_dir(tmp_path / "ckpt") / CHECKPOINT_STATE_FILE)["epoch"] >= 1


def test_a_machine_that_never_joins_ends_the_wait_with_one_line(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = run(seq2onnx("train", *SMALL_REVERSE, "--out", "ckpt", "--nproc-per-node", "1", "--nnodes", "2",
                          "--rdzv-endpoint", endpoint, "--rdzv-timeout", "3"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert f"waiting for 2 machines to join the rendezvous at {endpoint} (up to 3 s" in result.stderr
    assert f"Error: not all 2 machines joined the rendezvous at {endpoint} within 3 s" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "ckpt").exists()


# ---- the launcher -------------------------------------------------------------------------------------------

def test_every_option_reaches_the_ranks_as_given() -> None:
    from cli.launch import forwarded_args, torchrun_args
    from cli.launch_options import LAUNCH_OPTIONS
    from cli.train import train

    given = ["--data", "reverse", "--lr", "0.0007", "--no-bucket", "--tie-embeddings", "--threads", "1",
             "--nproc-per-node", "2", "--out", "x y", "--seed", "3", "--quiet"]
    ctx = train.make_context("train", list(given))
    forwarded = forwarded_args(ctx)
    assert "--nproc-per-node" not in forwarded
    again = train.make_context("train", forwarded)
    launch_names = set(LAUNCH_OPTIONS)
    assert {k: v for k, v in again.params.items() if k not in launch_names} == \
        {k: v for k, v in ctx.params.items() if k not in launch_names}
    launch = {**dict.fromkeys(LAUNCH_OPTIONS), "nproc_per_node": 2, "max_restarts": 2}
    assert torchrun_args(launch, ["--quiet"]) == ["--nproc-per-node", "2", "--standalone", "--max-restarts", "2",
                                                  "-m", "training", "--quiet"]
    several = {**launch, "nnodes": 3, "rdzv_endpoint": "h:1", "rdzv_id": "j", "rdzv_timeout": 9, "max_restarts": None}
    assert torchrun_args(several, []) == ["--nproc-per-node", "2", "--nnodes", "3", "--rdzv-backend", "c10d",
                                          "--rdzv-endpoint", "h:1", "--rdzv-id", "j", "--rdzv-conf", "join_timeout=9",
                                          "-m", "training"]


@pytest.mark.parametrize("failures, root", [
    # a killed rank and rank 0's own exit on losing it, seen by torchrun in one poll (one whole second)
    ({0: (1, 100), 1: (-signal.SIGKILL, 100)}, 1),
    # a rank that failed on its own, and rank 0 stopped by torchrun's SIGTERM: the earliest
    ({0: (-signal.SIGTERM, 101), 1: (1, 100)}, 1),
    ({0: (1, 100), 1: (2, 100)}, 0),  # ties without a signal: the lowest rank
])
def test_the_launcher_names_the_failure_that_stopped_the_run(failures: dict[int, tuple[int, int]],
                                                              root: int) -> None:
    from types import SimpleNamespace

    from cli.launch import _root_failure

    given = {rank: SimpleNamespace(exitcode=code, timestamp=stamp) for rank, (code, stamp) in failures.items()}
    assert _root_failure(given) == (root, given[root])


def test_the_launcher_is_refused_inside_torchrun(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "1"}
    result = run(seq2onnx("train", "--nproc-per-node", "2", "--out", "o"), cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert "started by torchrun already (rank 0 of 2)" in result.stderr
    assert list(tmp_path.iterdir()) == []


MORE = max_threads() + 1  # processes on this machine: one more than its CPUs
TOO_MANY_HERE = (f"LOCAL_WORLD_SIZE={MORE}: {MORE} processes on this machine, more than the {max_threads()} "
                 f"CPU{'' if max_threads() == 1 else 's'} this process may use; each training process needs one of "
                 "its own (oversubscribed, they wait on each other at every all-reduce), so start at most "
                 f"{max_threads()} here (torchrun --nproc-per-node {max_threads()})")


STOPPED_BY_TORCHRUN = "Error: train: stopped by SIGTERM; nothing was written (outputs are published whole or not at all)"


def test_torchrun_with_more_processes_than_cpus_is_refused(tmp_path: Path) -> None:
    """As `train --nproc-per-node` refuses it: torchrun's own ranks, one more than the CPUs, each refuse before
    torch loads (they trained, oversubscribed, several times slower), and nothing is written."""
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(MORE),
                  "--log-dir", str(tmp_path / "logs"), "-m", "cli", "train", *SMALL_REVERSE, "--out", "o"],
                 cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    # the first rank to refuse fails the run, and torchrun stops the others: a rank it stopped first says so
    said = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert said and all(line.startswith(f"Error: {TOO_MANY_HERE}, in the environment") or
                        line == STOPPED_BY_TORCHRUN for line in said), said
    assert any(line.startswith(f"Error: {TOO_MANY_HERE}") for line in said), said
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("given", "said"), [
    ({"RANK": "x"}, "RANK='x': expected a whole number, 0 or more"),
    ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc': expected a port, 1 to 65535"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0': expected a whole number, 1 or more"),
    ({"WORLD_SIZE": "-2"}, "WORLD_SIZE='-2': expected a whole number, 1 or more"),
    ({"RANK": "5"}, "RANK=5 of WORLD_SIZE=2: a rank is 0 to WORLD_SIZE - 1"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: expected a port, 1 to 65535"),
    ({"LOCAL_WORLD_SIZE": str(MORE), "WORLD_SIZE": str(MORE)}, TOO_MANY_HERE),
    ({"WORLD_SIZE": "\u00b2"}, "WORLD_SIZE='\u00b2': expected a whole number, 1 or more"),
    ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE='0': expected a whole number, 1 or more"),
    ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=5 of LOCAL_WORLD_SIZE=2: a rank is 0 to "
                                                   "LOCAL_WORLD_SIZE - 1"),
    ({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "1"}, "LOCAL_WORLD_SIZE=2 of WORLD_SIZE=1: a machine's processes are "
                                                   "some of the run's"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR='': expected the host name or address of rank 0's machine"),
], ids=["rank-not-a-number", "port-not-a-number", "no-processes", "negative-processes", "rank-past-the-size",
        "port-too-high", "more-processes-than-cpus", "a-superscript-digit", "no-local-processes",
        "local-rank-past-the-local-size", "more-here-than-in-all", "empty-master-addr"])
def test_launch_variables_set_by_hand_that_cannot_work_are_one_line(tmp_path: Path, given: dict[str, str],
                                                                     said: str) -> None:
    """A ValueError traceback from torch's rendezvous (a rank or port that is no number, no processes), or a
    30-minute wait for peers that could never come (RANK >= WORLD_SIZE)."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), **given}
    result = run(seq2onnx("train", *SMALL_REVERSE, "--out", "o"), cwd=tmp_path, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: {said}, in the environment (torchrun sets"), \
        result.stderr
    assert list(tmp_path.iterdir()) == []


NOT_LAUNCHED = (*LAUNCH_ENV, "LOCAL_RANK")  # the variables a launcher sets, dropped from this environment


@pytest.mark.parametrize(("given", "missing", "unset"), [
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR, MASTER_PORT", "RANK and WORLD_SIZE"),
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "RANK, MASTER_PORT", "WORLD_SIZE"),
    ({"RANK": "1", "LOCAL_RANK": "1"}, "WORLD_SIZE, MASTER_ADDR, MASTER_PORT", "RANK"),
], ids=["rank-without-rendezvous", "size-without-rank", "rank-without-size"])
def test_a_rank_named_by_half_the_launch_variables_is_refused(tmp_path: Path, given: dict[str, str], missing: str,
                                                              unset: str) -> None:
    """A RANK above 0 or a WORLD_SIZE above 1 without the rest of what the rendezvous needs: the process trained
    alone, silently, and wrote a checkpoint as if the run it was meant to join did not exist."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_LAUNCHED} | given
    result = run(seq2onnx("train", *SMALL_REVERSE, "--out", "o"), cwd=tmp_path, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert f"in the environment without {missing}: a process started as one rank of a run needs all of RANK, " \
           "WORLD_SIZE, MASTER_ADDR, MASTER_PORT" in line, line
    assert line.endswith(f"unset {unset} to train in one process"), line
    assert list(tmp_path.iterdir()) == []


def test_a_run_of_one_process_started_without_local_rank_trains_and_waits_for_no_one(tmp_path: Path) -> None:
    """The four variables torch's env:// rendezvous reads, as launchers other than torchrun set them (no
    LOCAL_RANK: it was refused as incomplete, and before that the process was no rank at all), WORLD_SIZE=1: it
    trains, without saying it waits for other processes (there are none)."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_LAUNCHED} | {
        "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = run(seq2onnx("train", *SMALL_REVERSE, "--epochs", "1", "--out", "o"), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "waiting for the other processes" not in result.stderr, result.stderr
    assert (tmp_path / "o" / "weights.pt").exists()


@pytest.mark.parametrize("given", [
    {}, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, {"WORLD_SIZE": "1"}, {"RANK": "0"},
    {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1"}, {"LOCAL_RANK": "3"}, dict.fromkeys(LAUNCH_ENV, "0"),
], ids=["none", "rendezvous-only", "one-process", "rank-0", "alone-without-port", "local-rank-only", "all"])
def test_launch_variables_that_name_no_rank_of_several_or_all_of_them_pass(monkeypatch: pytest.MonkeyPatch,
                                                                           given: dict[str, str]) -> None:
    for name in NOT_LAUNCHED:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    assert partial_launch_env() is None


@pytest.mark.parametrize(("rank", "sent", "code"), [(1, signal.SIGTERM, 143), (0, signal.SIGINT, 130)],
                         ids=["rank-1-sigterm", "rank-0-ctrl-c"])
def test_a_rank_started_by_hand_says_what_it_waits_for_and_stops(launched: Any, tmp_path: Path, rank: int,
                                                                   sent: int, code: int) -> None:
    """A rank started by hand waits for its peers (rank 0 for them to connect, another rank to reach rank 0),
    saying so; SIGTERM and Ctrl-C end the wait at once. They did not: torch's store wait retries through EINTR in
    C++, and the rank waited out its 30 minutes (or a SIGKILL)."""
    port = free_port()
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    waiting = launched(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "training",
                        *SMALL_REVERSE, "--out", "ckpt"])
    notice = f"rank {rank} of 2: waiting for the other processes at 127.0.0.1:{port} (up to 30 min)"
    wait_for(lambda: notice in waiting.output() or waiting.proc.poll() is not None, 60, "the waiting notice")
    time.sleep(1)  # into the store's wait
    assert waiting.proc.poll() is None, waiting.output()  # still waiting
    waiting.proc.send_signal(sent)
    assert waiting.proc.wait(STOP_WITHIN_S) == code, waiting.output()
    assert "Traceback" not in waiting.output() and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("after_s", [0.4, 1.0])
def test_a_rank_other_than_0_stopped_while_it_starts_says_nothing(tmp_path: Path, after_s: float) -> None:
    """Ctrl-C while a rank other than 0 loads and checks its options (before it joins the run): it leaves with 130
    and no line, as it does later (rank 0 says it, the launcher that every process stopped). It said 'Error: train:
    interrupted; nothing was written', so a run stopped as it started printed that line twice, and a third."""
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen([sys.executable, "-m", "training", *SMALL_REVERSE, "--out", "ckpt"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_stops)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=STOP_WITHIN_S)
    assert proc.returncode == 130, output
    assert "Error" not in output and "Traceback" not in output, output  # (the wait's notice may be there)
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_rank_waiting_for_its_peers_address_stops_at_once(launched: Any, tmp_path: Path, sent: int,
                                                            code: int) -> None:
    """Past the rendezvous, gloo's connection waits in the store for each peer's address, in C++: a rank whose
    peer stopped before writing it (Ctrl-C at start-up, the peer quicker) took no signal, and torchrun waited its
    30 s before killing it (under load, the suite's Ctrl-C test ran past its minute). The peer here is a store
    client that connects and never writes."""
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    waiting = launched(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "training",
                        *SMALL_REVERSE, "--out", "ckpt"])
    deadline = time.monotonic() + 60
    while True:  # rank 0 hosts the store once it has loaded
        try:
            peer = torch.distributed.TCPStore("127.0.0.1", port, world_size=2, is_master=False,
                                              timeout=timedelta(seconds=5))
            break
        except (RuntimeError, TimeoutError):
            assert time.monotonic() < deadline and waiting.proc.poll() is None, waiting.output()
            time.sleep(0.2)
    wait_for(lambda: peer.num_keys() >= 2 or waiting.proc.poll() is not None, 60, "rank 0's address in the store")
    time.sleep(0.5)  # into the wait for rank 1's
    assert waiting.proc.poll() is None, waiting.output()
    waiting.proc.send_signal(sent)
    assert waiting.exit_code(20) == code, waiting.output()
    assert "Traceback" not in waiting.output() and not (tmp_path / "ckpt").exists()


def test_python_m_training_is_the_train_command(tmp_path: Path) -> None:
    result = run([sys.executable, "-m", "training", "--help"], cwd=tmp_path)
    assert result.returncode == 0 and "Usage: seq2onnx train" in result.stdout
    assert "--nproc-per-node" in result.stdout and "--rdzv-endpoint" in result.stdout
