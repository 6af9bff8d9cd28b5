"""Child processes that a test can interrupt (SIGINT reaches them) and never leaves running."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator


def default_stops() -> None:
    """A child's `preexec_fn`: SIGINT, SIGTERM and SIGHUP back to their defaults. A shell without job control (a CI
    script, `cmd &` in a script) starts background jobs with SIGINT ignored, `nohup` starts its command with SIGHUP
    ignored, children inherit that, and Python keeps an inherited SIG_IGN: a child the test stops on purpose would
    never see its signal (a suite run under `nohup` failed every hang-up test)."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def child_process(args: list[str], **kwargs: object) -> Iterator[subprocess.Popen]:
    """Popen that receives the stops the test sends whatever the runner inherited, and is killed if left running."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_stops, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@contextlib.contextmanager
def logged_process(args: list[str], log: Path, **kwargs: Any) -> Iterator[subprocess.Popen]:
    """A child in a session of its own, its stdout and stderr written to `log`; its group killed if the test leaves
    it running."""
    with open(log, "w") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_refused_in_one_line(done: subprocess.CompletedProcess, says: str) -> None:
    """A script refused its input before any work: non-zero, no traceback, nothing on stdout, `says` on stderr."""
    assert done.returncode != 0 and "Traceback" not in done.stderr and not done.stdout
    assert says in done.stderr, done.stderr


def command_line(pid: int) -> str:
    """A process's command line, for a failure message."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid} (gone)"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, group, ...); None where it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_state(pid: int) -> str | None:
    """`pid`'s state letter (R, S, T, Z, ...), None where there is no such process."""
    fields = _stat(pid)
    return None if fields is None else fields[0]


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    return process_state(pid) not in (None, "Z")


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(entry.name)
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def wait_until(process: subprocess.Popen, reached: Callable[[], bool], timeout: float, log: Path) -> None:
    """Poll until `reached()`, failing with the end of `log` if `process` exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not reached():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)


def leftovers(process: subprocess.Popen, timeout: float, log: Path) -> list[str]:
    """Wait `timeout` for `process`, leader of its own process group, to exit (failing with where it stood if it
    does not), then up to 20 s for its group to go (Ray's helpers exit right after the driver): the command lines
    of what was left, which is then killed."""
    import pytest

    try:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # seen once in a CI run (2026-11-29): say where it stood
            pytest.fail(f"{process.args[:4]} did not stop within {timeout} s of the signal; its group: "
                        f"{[command_line(pid) for pid in group_members(process.pid)]}; its log:\n"
                        f"{log.read_text()[-3000:]}")
        deadline = time.monotonic() + 20
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        return [command_line(pid) for pid in group_members(process.pid)]
    finally:
        if process.poll() is None or group_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
