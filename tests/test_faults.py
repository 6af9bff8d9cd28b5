"""Reliability: a SIGKILL at any moment, a killed run's leftovers, two writers at once: never a mix in --out."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from runtime import atomic, atomic_file, siblings, writer_lock
from runtime.atomic import publish, staged_directory
from runtime.contract import (
    CHECKPOINT_STATE_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    GREEDY_FILE,
    MANIFEST_FILE,
    partial_dir,
)
from runtime.model import Seq2Seq
from runtime.siblings import clean_leftovers
from runtime.writer_lock import DestinationBusyError, exclusive, lock_file
from training.checkpoint import CHECKPOINT_FILES, load_checkpoint

CLI = [sys.executable, "-m", "cli"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
EPOCHS = "8"  # the train command's cost is mostly start-up; a few epochs give the kills a training phase to hit
OTHER_SEED = "7"  # a run whose weights differ from the reference's, to tell old from new
RANDOM_KILLS = 3  # random kill moments per command, one per slice of the run; then one more while staging
STAGING_EXTRA_S = 0.05  # the kill while staging comes this long at most after the staging directory appears
KILL_WINDOW = (0.3, 1.05)  # fractions of an uninterrupted run's time: from after start-up to just past the end
RESUME_EXTRA_S = 0.3  # after the first saved epoch, kill within this many seconds
KILL_SEED = 20240607
RUN_TIMEOUT_S = 300
POLL_S = 0.01
BUSY = "another seq2onnx process is writing it"
EXISTS = "already exists"
TIMESTAMP_TICK_S = 0.05  # longer than the kernel's timestamp granularity (a clock tick)
HEX = "0123456789ab"  # a 12-hex-digit name part, as `siblings.sibling` draws them

HOLD_LOCK = """
import sys
from runtime.writer_lock import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def child_env() -> dict[str, str]:
    """The commands' environment: one intra-op thread, as the tiny models gain nothing from more.

    Extra threads only spin; with one, the ~20 runs here need a third less CPU on a 2-core machine."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """One seq2onnx command to completion."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=RUN_TIMEOUT_S,
                          env=child_env())


def start(args: list[str], cwd: Path, quiet: bool = True) -> subprocess.Popen[str]:
    """One seq2onnx command in the background (output discarded unless asked for)."""
    sink = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen([*CLI, *args], stdout=sink, stderr=sink, text=True, cwd=cwd, env=child_env())


def wait_until(proc: subprocess.Popen[str], ready: Callable[[], bool]) -> bool:
    """Poll until `ready()` or the process exits; True if it is still running."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return proc.poll() is None


def kill_when(args: list[str], cwd: Path, ready: Callable[[], bool], extra: float = 0.0) -> bool:
    """Start a command and SIGKILL it `extra` seconds after `ready()`; True if it was killed, not finished."""
    proc = start(args, cwd)
    if wait_until(proc, ready):
        time.sleep(extra)
        proc.kill()
    return proc.wait(timeout=RUN_TIMEOUT_S) == -signal.SIGKILL


def staging_exists(out: Path) -> Callable[[], bool]:
    """Whether a writer of `out` has its staging directory beside it."""
    return lambda: any(name.endswith(".tmp") for name in our_siblings(out))


def kill_at_random_moments(args: list[str], cwd: Path, seconds: float, seed: int, out: Path,
                           check: Callable[[], None]) -> None:
    """Kill `args` at RANDOM_KILLS seeded moments spanning its run, then once while it stages; `check` after each.

    The last kill must leave a staging directory and the lock file behind, for the next run to clean up."""
    for delay in kill_moments(seconds, seed):
        deadline = time.monotonic() + delay
        kill_when(args, cwd, lambda deadline=deadline: time.monotonic() >= deadline)
        check()
    extra = random.Random(seed).uniform(0, STAGING_EXTRA_S)
    assert kill_when(args, cwd, staging_exists(out), extra), "finished before it could be killed while staging"
    check()
    assert our_siblings(out), "a writer killed while staging left nothing behind"


def kill_moments(seconds: float, seed: int) -> list[float]:
    """RANDOM_KILLS seeded random delays, one in each equal slice of KILL_WINDOW of a run taking `seconds`."""
    rng = random.Random(seed)
    low, high = (fraction * seconds for fraction in KILL_WINDOW)
    width = (high - low) / RANDOM_KILLS
    return [low + width * (i + rng.random()) for i in range(RANDOM_KILLS)]


def tree_hashes(path: Path) -> dict[str, str]:
    """sha256 of every file under `path`, by relative name."""
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


def our_siblings(out: Path) -> list[str]:
    """Hidden names beside `out` that a writer of `out` makes: staging, backups, the lock."""
    return sorted(name for name in os.listdir(out.parent) if name.startswith(f".{out.name}."))


def assert_old_or_new(out: Path, old: dict[str, str], loads: Callable[[Path], object]) -> None:
    """`out` is the complete old tree, byte for byte, or a new one that loads and passes its checks."""
    assert out.is_dir(), f"{out} is missing after a kill"
    if tree_hashes(out) != old:
        loads(out)


POINT_EXPORT_FILES = {MANIFEST_FILE, ENCODER_FILE, DECODER_STEP_FILE, GREEDY_FILE}


def load_export(path: Path) -> None:
    """A whole export: all its files, and it loads (manifest version, every graph's sha256, graph I/O)."""
    assert set(os.listdir(path)) == POINT_EXPORT_FILES
    Seq2Seq.load(path, provider="cpu")


def load_whole_checkpoint(path: Path) -> None:
    """A whole checkpoint: all its files, and it loads."""
    assert set(os.listdir(path)) == CHECKPOINT_FILES
    load_checkpoint(path)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """An uninterrupted `train --epochs EPOCHS` (default seed) and how long it took."""
    root = tmp_path_factory.mktemp("reference")
    began = time.monotonic()
    proc = run(["train", "--quiet", "--epochs", EPOCHS, "--out", str(root / "ck")], root)
    assert proc.returncode == 0, proc.stderr
    return root / "ck", time.monotonic() - began


# ---- whole commands, killed or racing ----

@pytest.mark.slow  # real processes killed at chosen moments: the longest of the fault tests
def test_sigkill_during_train_force_leaves_the_old_or_the_new_checkpoint(tmp_path: Path,
                                                                        reference: tuple[Path, float]) -> None:
    ref, seconds = reference
    out = tmp_path / "ck"
    shutil.copytree(ref, out)
    old = tree_hashes(out)
    args = ["train", "--quiet", "--epochs", EPOCHS, "--seed", OTHER_SEED, "--force", "--out", str(out)]
    kill_at_random_moments(args, tmp_path, seconds, KILL_SEED, out,
                           lambda: assert_old_or_new(out, old, load_whole_checkpoint))
    proc = run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    load_whole_checkpoint(out)
    assert tree_hashes(out) != old
    assert our_siblings(out) == [] and not partial_dir(out).exists()


@pytest.mark.slow  # real processes killed at chosen moments: the longest of the fault tests
def test_sigkill_during_export_force_leaves_the_old_or_the_new_export(tmp_path: Path,
                                                                      reference: tuple[Path, float]) -> None:
    ref, _ = reference
    out = tmp_path / "model"
    args = ["export", str(ref), "--force", "--out", str(out)]
    began = time.monotonic()
    proc = run(args, tmp_path)
    seconds = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    old = tree_hashes(out)
    kill_at_random_moments(args, tmp_path, seconds, KILL_SEED + 1, out,
                           lambda: assert_old_or_new(out, old, load_export))
    proc = run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    load_export(out)
    assert tree_hashes(out) != old  # a fresh export id, so fresh graph bytes and manifest
    assert our_siblings(out) == []


@pytest.mark.slow  # real processes killed at chosen moments: the longest of the fault tests
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path, reference: tuple[Path, float]) -> None:
    ref, _ = reference
    out = tmp_path / "ck"
    state = partial_dir(out) / CHECKPOINT_STATE_FILE
    args = ["train", "--quiet", "--epochs", EPOCHS, "--save-every", "1", "--out", str(out)]
    extra = random.Random(KILL_SEED).uniform(0, RESUME_EXTRA_S)
    assert kill_when(args, tmp_path, state.exists, extra), "the run ended before it could be killed"
    resumed = run(["train", "--quiet", "--resume", "--out", str(out)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    (model, _, history), (straight, _, straight_history) = load_checkpoint(out), load_checkpoint(ref)
    assert history == straight_history
    for name, tensor in straight.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert our_siblings(out) == [] and not partial_dir(out).exists()


def race(args: list[str], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run the same command twice at once; the results, winner first."""
    procs = [start(args, cwd, quiet=False) for _ in range(2)]
    outputs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    done = [subprocess.CompletedProcess(p.args, p.returncode, *output) for p, output in zip(procs, outputs)]
    return sorted(done, key=lambda p: p.returncode)


def assert_one_winner(results: list[subprocess.CompletedProcess[str]]) -> None:
    """Exactly one succeeded; the other failed with one clear line and no traceback."""
    winner, loser = results
    assert winner.returncode == 0, winner.stderr
    assert loser.returncode != 0
    assert "Traceback" not in loser.stderr, loser.stderr
    errors = [line for line in loser.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and (BUSY in errors[0] or EXISTS in errors[0]), loser.stderr


def test_two_exports_to_one_destination_one_wins(tmp_path: Path, reference: tuple[Path, float]) -> None:
    ref, _ = reference
    out = tmp_path / "model"
    assert_one_winner(race(["export", str(ref), "--out", str(out)], tmp_path))
    load_export(out)
    assert our_siblings(out) == []


def test_two_trains_to_one_destination_one_wins(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    assert_one_winner(race(["train", "--quiet", "--epochs", "1", "--out", str(out)], tmp_path))
    load_whole_checkpoint(out)
    # train holds the lock for the whole run, so the loser never wrote a .partial state of its own
    assert our_siblings(out) == [] and not partial_dir(out).exists()


# ---- exclusive() ----

@contextlib.contextmanager
def held_elsewhere(out: Path) -> Iterator[None]:
    """`out`'s writer lock held by another process for the block; that process is killed at its end."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait(timeout=RUN_TIMEOUT_S)


def test_a_second_process_is_refused_and_a_killed_holder_does_not_block(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with held_elsewhere(out):
        with pytest.raises(DestinationBusyError) as caught:
            with exclusive(out):
                pass
        message = str(caught.value)
        assert BUSY in message and str(lock_file(out)) in message and "\n" not in message
        assert isinstance(caught.value, OSError)
    assert lock_file(out).exists()  # a killed holder leaves its lock file, but no lock on it
    with exclusive(out):
        pass
    assert not lock_file(out).exists()


def test_an_export_to_a_busy_out_is_refused_before_it_says_it_checks_parity(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with held_elsewhere(out):
        done = run(["export", str(ARTIFACTS / "squares-checkpoint"), "--out", str(out)], tmp_path)
    assert done.returncode == 1 and BUSY in done.stderr
    assert "checking parity" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert not out.exists()


def test_directories_made_for_an_out_never_written_go_with_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "out"
    with exclusive(out) as lock:
        assert lock.parent.is_dir()
    assert not (tmp_path / "a").exists()
    with exclusive(out):
        out.mkdir()  # published: it and its directories stay
    assert out.is_dir()
    kept = tmp_path / "c" / "out"
    with exclusive(kept):
        partial_dir(kept).mkdir()  # an interrupted run's state beside --out keeps its directory
    assert partial_dir(kept).is_dir() and not kept.exists()


def test_an_export_refused_at_parity_leaves_no_directories_it_made(tmp_path: Path) -> None:
    out = tmp_path / "nd" / "q" / "r"
    done = run(["export", str(ARTIFACTS / "squares-checkpoint"), "--out", str(out), "--atol", "0", "--rtol", "0",
                "--drift-atol", "0"], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "nd").exists()


def test_exclusive_is_reentrant_in_one_thread_and_busy_for_another(tmp_path: Path) -> None:
    out = tmp_path / "out"
    refused: list[BaseException] = []

    def other_thread() -> None:
        try:
            with exclusive(out):
                pass
        except DestinationBusyError as err:
            refused.append(err)

    with exclusive(out) as lock:
        with exclusive(tmp_path / "elsewhere" / ".." / "out"):  # another spelling, the same lock
            assert lock.exists()
        assert_locked(lock)  # leaving the inner level keeps the lock
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert len(refused) == 1 and "another thread" in str(refused[0])
    assert not lock.exists()
    with exclusive(out):  # released for good
        pass


def assert_locked(lock: Path) -> None:
    """Another open file description on `lock` cannot take it (flock conflicts even within one process)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_exclusive_retries_when_the_lock_file_was_replaced_under_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    lock = lock_file(out)
    real_flock, calls = fcntl.flock, []

    def releaser_then_newcomer(fd: int, operation: int) -> None:
        """On the first try, do what a releasing holder and a newcomer would do between our open and flock."""
        if not calls:
            lock.unlink()
            lock.touch()
        calls.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(writer_lock.fcntl, "flock", releaser_then_newcomer)
    with exclusive(out):
        monkeypatch.setattr(writer_lock.fcntl, "flock", real_flock)
        assert len(calls) == 2  # the first flock held an unlinked inode, so it tried again
        assert_locked(lock)
    assert not lock.exists()


# ---- publish ----

def make_tree(path: Path, content: str) -> Path:
    """A directory holding one file with `content`."""
    path.mkdir()
    (path / MANIFEST_FILE).write_text(content)
    return path


def test_publish_swaps_atomically_where_the_system_can(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if atomic._renameat2() is None:
        pytest.skip("libc has no renameat2")

    def no_fallback(staging: Path, out: Path) -> None:
        raise AssertionError("fell back to two renames")

    monkeypatch.setattr(atomic, "_swap_aside", no_fallback)
    out = make_tree(tmp_path / "out", "old")
    staging = make_tree(tmp_path / f".out.{HEX}.tmp", "new")
    publish(staging, out, lambda existing: None)
    assert (out / MANIFEST_FILE).read_text() == "new"
    assert os.listdir(tmp_path) == ["out"]


def test_publish_falls_back_to_two_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    out = make_tree(tmp_path / "out", "old")
    with staged_directory(out, lambda existing: None) as staging:
        (staging / MANIFEST_FILE).write_text("new")
    assert (out / MANIFEST_FILE).read_text() == "new"
    assert os.listdir(tmp_path) == ["out"]


def test_publish_refuses_a_destination_that_appeared_meanwhile(tmp_path: Path) -> None:
    out = make_tree(tmp_path / "out", "someone else's")
    staging = make_tree(tmp_path / f".out.{HEX}.tmp", "ours")
    with pytest.raises(DestinationBusyError, match="appeared while this run was writing it"):
        atomic._rename_new(staging, out)
    assert (out / MANIFEST_FILE).read_text() == "someone else's"


def test_a_failed_write_leaves_the_destination_and_nothing_else(tmp_path: Path) -> None:
    out = make_tree(tmp_path / "out", "old")
    with pytest.raises(RuntimeError, match="boom"):
        with staged_directory(out, lambda existing: None) as staging:
            (staging / MANIFEST_FILE).write_text("half")
            raise RuntimeError("boom")
    assert (out / MANIFEST_FILE).read_text() == "old"
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "no-hard-links"])
def test_write_file_keeps_a_file_that_appeared_unless_replacing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                links: bool) -> None:
    out = tmp_path / "figures.json"
    if not links:  # a file system without hard links: a look, then the rename
        def no_link(src: object, dst: object) -> None:
            raise OSError(errno.EPERM, "no hard links here")

        monkeypatch.setattr(atomic_file.os, "link", no_link)

    def write(f: object) -> None:  # the file lands while ours is being written
        out.write_text("mine")
        f.write(b"ours")  # type: ignore[attr-defined]

    with pytest.raises(FileExistsError, match="appeared there while it was being written"):
        atomic_file.write_file(out, write, replace=False)
    assert out.read_text() == "mine" and os.listdir(tmp_path) == ["figures.json"]
    atomic_file.write_file(out, write, replace=True)
    assert out.read_text() == "ours" and os.listdir(tmp_path) == ["figures.json"]
    out.unlink()
    atomic_file.write_file(out, lambda f: f.write(b"new"), replace=False)  # nothing there: written, sibling gone
    assert out.read_text() == "new" and os.listdir(tmp_path) == ["figures.json"]


def test_cli_outputs_keep_a_file_that_appeared_during_the_run(tmp_path: Path) -> None:
    import click

    from cli.infer import write_atomically

    out = tmp_path / "out.jsonl"

    def write(f: object) -> None:
        out.write_text("mine")
        f.write(b"{}")  # type: ignore[attr-defined]

    with pytest.raises(click.ClickException, match="appeared there while this ran; it was kept"):
        write_atomically(str(out), write, force=False)
    assert out.read_text() == "mine"
    write_atomically(str(out), write, force=True)
    assert out.read_text() == "{}" and os.listdir(tmp_path) == ["out.jsonl"]


# ---- clean_leftovers ----

UNRELATED = [".out.lock", "out.partial", f".out.partial.{HEX}.tmp", ".out.0123456789a.tmp", ".out.0123456789AB.tmp",
             f".outx.{HEX}.tmp", f".out.{HEX}.tmp.keep", f"out.{HEX}.tmp", f".out.{HEX}.bak", "notes.txt"]


def test_clean_leftovers_restores_a_backup_when_out_is_missing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for name in UNRELATED:
        (tmp_path / name).write_text("keep")
    older = make_tree(tmp_path / "older", "older")
    newer = make_tree(tmp_path / "newer", "newer")
    older.rename(tmp_path / f".out.{'a' * 12}.old")  # a rename sets ctime: moved aside first, so older
    time.sleep(TIMESTAMP_TICK_S)
    newer.rename(tmp_path / f".out.{'b' * 12}.old")
    make_tree(tmp_path / f".out.{'c' * 12}.tmp", "half-written staging")
    (tmp_path / f".out.{'d' * 12}.tmp").write_text("a half-written file")
    clean_leftovers(out)
    assert (out / MANIFEST_FILE).read_text() == "newer"
    assert sorted(os.listdir(tmp_path)) == sorted(["out", *UNRELATED])
    assert all((tmp_path / name).read_text() == "keep" for name in UNRELATED)


def test_clean_leftovers_drops_backups_when_out_exists(tmp_path: Path) -> None:
    out = make_tree(tmp_path / "out", "current")
    make_tree(tmp_path / f".out.{HEX}.old", "previous")
    make_tree(tmp_path / f".out.{'f' * 12}.tmp", "old tree being deleted")
    clean_leftovers(out)
    assert (out / MANIFEST_FILE).read_text() == "current"
    assert os.listdir(tmp_path) == ["out"]


def test_the_next_writer_cleans_a_killed_writers_leftovers(tmp_path: Path) -> None:
    out = make_tree(tmp_path / "out", "old")
    make_tree(tmp_path / f".out.{HEX}.tmp", "killed mid-write")
    (tmp_path / ".out.lock").write_text("")  # the killed writer's lock file, no longer locked
    with staged_directory(out, lambda existing: None) as staging:
        (staging / MANIFEST_FILE).write_text("new")
        assert sorted(os.listdir(tmp_path)) == sorted([".out.lock", staging.name, "out"])
    assert (out / MANIFEST_FILE).read_text() == "new"
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("name", ["x" * 236, "x" * 237, "a" * 249 + ".jsonl", "é" * 125 + ".npz"])
def test_a_long_valid_name_is_written_through_siblings_within_the_name_limit(tmp_path: Path, name: str) -> None:
    """Staging and lock siblings add their marks to the name; for a name near 255 bytes they carry a shortened
    stem and a hash instead, so any name the file system takes can be written, and a killed writer's leftovers of
    that name are still found."""
    assert len(os.fsencode(name)) <= siblings.NAME_MAX
    atomic_file.write_file(tmp_path / name, lambda f: f.write(b"data"))
    assert (tmp_path / name).read_bytes() == b"data" and os.listdir(tmp_path) == [name]
    out = tmp_path / f"d{name[1:]}"
    assert len(os.fsencode(siblings.sibling(out, siblings.STAGING_SUFFIX).name)) <= siblings.NAME_MAX
    assert len(os.fsencode(writer_lock.lock_file(out).name)) <= siblings.NAME_MAX
    make_tree(siblings.sibling(out, siblings.STAGING_SUFFIX), "killed mid-write")
    with staged_directory(out, lambda existing: None) as staging:
        (staging / MANIFEST_FILE).write_text("new")
    assert (out / MANIFEST_FILE).read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == sorted([name, out.name])


def test_exchange_errors_other_than_unsupported_are_raised(tmp_path: Path) -> None:
    if atomic._renameat2() is None:
        pytest.skip("libc has no renameat2")
    with pytest.raises(OSError) as caught:
        atomic._exchange(tmp_path / "missing", make_tree(tmp_path / "out", "x"))
    assert caught.value.errno == errno.ENOENT


def test_a_stop_raised_and_swallowed_before_is_honoured_where_an_output_would_be_published(tmp_path: Path) -> None:
    """A SIGTERM whose Terminated landed in a weakref callback (importlib's module locks), where Python ignores it,
    was lost: the export went on, published and exited 0. The record the handler keeps stops both kinds of
    publish."""
    from runtime.errors import RAISED_STOPS, Terminated

    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.txt").write_text("x")
    RAISED_STOPS.append(signal.SIGTERM)
    try:
        with pytest.raises(Terminated):
            publish(staging, tmp_path / "out", lambda out: None)
        with pytest.raises(Terminated):
            atomic_file.write_file(tmp_path / "file.txt", lambda f: f.write(b"x"))
    finally:
        RAISED_STOPS.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["staging"]  # nothing published, no sibling left
    publish(staging, tmp_path / "out", lambda out: None)  # with no stop raised, as before
    assert (tmp_path / "out" / "a.txt").read_text() == "x"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed KeyboardInterrupt
def test_a_ctrl_c_that_python_swallowed_stops_the_publish_as_ctrl_c(tmp_path: Path) -> None:
    """A Ctrl-C raised inside a weakref callback, where Python ignores the KeyboardInterrupt, was lost (SIGTERM's was
    recorded, Ctrl-C's was not): the command went on and published. Its record stops the publish as a Ctrl-C (exit
    130), not as a SIGTERM."""
    import weakref

    from cli.signals import record_interrupts, stopped_by_sigterm
    from runtime.errors import RAISED_STOPS, Terminated

    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "a.txt").write_text("x")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as the program starts with
    unrecord = record_interrupts()
    try:
        class Held:
            pass

        held = Held()
        ref = weakref.ref(held, lambda gone: signal.raise_signal(signal.SIGINT))  # raised in there: swallowed
        del held
        assert ref() is None and RAISED_STOPS == [signal.SIGINT] and not stopped_by_sigterm()
        with pytest.raises(KeyboardInterrupt) as caught:
            publish(staging, tmp_path / "out", lambda out: None)
        assert not isinstance(caught.value, Terminated)
    finally:
        unrecord()
        signal.signal(signal.SIGINT, previous)
        RAISED_STOPS.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["staging"]
