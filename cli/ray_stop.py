"""How the commands that drive Ray (`serve --ray`, `infer --ray`) stop on SIGTERM or Ctrl-C, whatever they were
doing at the time.

Every call into Ray runs on one thread of its own, start and stop alike: stopped from another thread than the one
that started it, Serve's controller stalled 30 s, and Ray took 17 s and left its agents running. So a signal never
lands inside a call into Ray. Raised there, as Python raises KeyboardInterrupt, it left Ray's agents running after
an interrupted `ray.init`, and came out of `serve.start` as a SystemError traceback (exit 1). The main thread only
turns signals into a request the Ray thread reads between its steps, then lets it stop what it started. A second
signal, or a stop that outlasts its deadline, kills the processes this command started (the local Ray) and exits
at once."""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .common import say, written_so_far
from .signals import stop_for

if TYPE_CHECKING:
    import psutil

POLL_S = 0.05  # how often the main thread looks at signals, the deadline, and whether Ray is up
SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_FAILED = 1


class Stop:
    """Stop requests, shared by the main thread (which receives the signals) and the Ray thread (which acts).
    `on_stop`: a line said as the first signal is taken, before the Ray thread can act on it, unless the Ray thread
    has said it `serves` (it then says its own line as it stops: `say_stopping`)."""

    def __init__(self, on_stop: str = "") -> None:
        self.requested = threading.Event()  # a signal came: stop at the next step, or now while serving
        self.stopping = threading.Event()  # the Ray thread is stopping what it started (on a request or a failure)
        # Ray is up: its core worker put a C++ handler on SIGTERM (it logs and aborts): the main thread puts ours back
        self.connected = threading.Event()
        self.serves = threading.Event()  # the Ray thread waits for a stop request alone, and says its own line
        self.signals: list[int] = []
        self.on_stop = on_stop
        self._said = False
        self._saying = threading.Lock()

    def on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)  # first: a second signal that lands inside `say` does not say it again
        if len(self.signals) == 1 and self.on_stop and not self.serves.is_set():
            self.say_stopping(self.on_stop)
        self.requested.set()

    def say_stopping(self, line: str) -> None:
        """Say `line` unless a stopping line was said already (by the other thread: one line, whichever is first)."""
        with self._saying:
            if not self._said:
                self._said = True
                say(line)


def drive(work: Callable[[Stop], None], deadline_s: float, who: str, limit: str = "", note: str = "",
          on_stop: str = "", writes: bool = False) -> int | None:
    """Run `work(stop)` on a thread of its own until it returns, this (the main) thread taking SIGTERM and SIGINT.
    Stopping, once asked for or once `work` says it began, may take `deadline_s`; past that, or on a second
    signal, the processes this one started are killed and the process exits, saying so (as `who`; `limit`: the
    option that set the deadline; `note`: what may outlive the process). `on_stop`: a line said as the first
    signal is taken, where `work` cannot say it at once. `writes`: `work` publishes outputs (`cli.common.published`),
    and a stop that kills says what it had written, or that nothing was.
    Returns the signal that asked to stop, if one did; raises what `work` raised."""
    stop, failure = Stop(on_stop), []

    def run() -> None:
        try:
            work(stop)
        except BaseException as exc:  # handed to the main thread, which raises it
            failure.append(exc)

    logging.getLogger("ray._private.worker").addFilter(_not_main_thread)
    _keep_sigterm_ours()
    thread = threading.Thread(target=run, name="seq2onnx-ray", daemon=True)
    previous = {sig: signal.signal(sig, stop.on_signal) for sig in SIGNALS}
    try:
        thread.start()
        deadline, rearmed = None, False
        while thread.is_alive():
            thread.join(POLL_S)
            if stop.connected.is_set() and not rearmed:
                for sig in SIGNALS:
                    signal.signal(sig, stop.on_signal)
                rearmed = True
            if len(stop.signals) > 1:
                _kill_and_exit(who, "a second signal while stopping", note + _written(writes),
                               stop_for(stop.signals[0]).exit_code)
            if deadline is None and (stop.requested.is_set() or stop.stopping.is_set()):
                deadline = time.monotonic() + deadline_s
            if deadline is not None and time.monotonic() > deadline and thread.is_alive():
                why = f"{limit}0 kills at once" if deadline_s == 0 else f"Ray did not stop within {limit}{deadline_s:g} s"
                _kill_and_exit(who, why, note + _written(writes),
                               stop_for(stop.signals[0]).exit_code if stop.signals else EXIT_FAILED)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise failure[0]
    return stop.signals[0] if stop.signals else None


def _written(writes: bool) -> str:
    """What a command that publishes outputs had written when it is killed: its outputs, or nothing."""
    return f"; {written_so_far()}" if writes else ""


def _keep_sigterm_ours() -> None:
    """Ray's core worker, as the driver connects, puts absl's failure handler on SIGTERM (it logs a stack and aborts:
    exit 134, nothing stopped), which stayed until the main thread put ours back after ray.init returned: a SIGTERM
    0-0.4 s after Ray's "Started a local Ray instance" aborted 4-5 times in 6 here. Ray's switch for it,
    RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read once as Ray is imported, is set for this process alone (from the
    environment every process of the Ray started here would take it); Python's faulthandler prints this process's
    stacks on a crash instead."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    faulthandler.enable()


def local_ray_failed(who: str, exc: Exception, reason: str) -> click.ClickException:
    """`who` could not start a local Ray, for `reason`; where Ray could not make its session directory (a
    read-only /tmp), which directory to set instead."""
    if isinstance(exc, OSError) and exc.filename is not None and _in_home(os.fsdecode(exc.filename)):
        home = os.path.expanduser("~")
        return click.ClickException(f"{who}: could not start a local Ray ({exc.strerror}: {exc.filename}); a local "
                                    f"Ray keeps its authentication token in ~/.ray/auth_token (HOME is {home}): make "
                                    "HOME writable, or give the token in RAY_AUTH_TOKEN")
    if isinstance(exc, OSError) and exc.filename is not None:
        return click.ClickException(f"{who}: could not start a local Ray ({exc.strerror}: {exc.filename}); a local "
                                    "Ray keeps its files in RAY_TMPDIR, else TMPDIR, else /tmp: set RAY_TMPDIR or "
                                    "TMPDIR to a writable directory")
    if "AF_UNIX path length" in reason:  # its socket paths, under the directory, longer than a socket's 107 bytes
        where = "RAY_TMPDIR" if os.environ.get("RAY_TMPDIR") else "TMPDIR" if os.environ.get("TMPDIR") else "/tmp"
        return click.ClickException(f"{who}: could not start a local Ray ({reason}); a local Ray makes its sockets "
                                    f"under RAY_TMPDIR, else TMPDIR, else /tmp (here {where}), and a socket's path "
                                    "must fit in 107 bytes: set RAY_TMPDIR to a directory with a shorter path")
    return click.ClickException(f"{who}: could not start a local Ray ({reason})")


def _in_home(path: str) -> bool:
    """Whether `path` is HOME's .ray, or under it (Ray makes its token there for a local Ray it starts)."""
    ray_dir = os.path.join(os.path.expanduser("~"), ".ray")
    return path == ray_dir or path.startswith(ray_dir + os.sep)


def keep_group_signals_from_ray() -> None:
    """Block SIGTERM and SIGHUP on this thread, the Ray thread, before it starts a local Ray. The processes Ray
    starts inherit the mask (and the workers its raylet starts, theirs), so a SIGTERM sent to the whole process group
    (`timeout`, `kill -TERM -PGID`, systemd's default KillMode=control-group) reaches only this command, which stops
    them in order, as Ray itself blocks SIGINT in them for Ctrl-C. Unblocked, it stopped Ray's GCS and raylet under
    Serve: `serve --ray` waited out --shutdown-timeout, then killed everything (exit 143), and the requests under
    way were lost. SIGHUP, which a closed terminal sends the whole group, the same way: this command takes it as SIGTERM
    (`cli.signals.hang_up_as_sigterm`). `ray.shutdown` would give each of its processes a second to take that
    SIGTERM before it kills them: `cli.ray_shutdown.leave_ray` kills them at once."""
    if threading.current_thread() is threading.main_thread():
        raise RuntimeError("keep_group_signals_from_ray: the main thread takes the signals; call it on the Ray thread")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})


# Ray Data's block prefetcher thread waits for work for as long as the process lives, and calls into Ray only when
# given blocks, which only Ray Data's reader (a thread `wait_for_threads` waits for) gives it
PARKED_THREADS = frozenset({"Prefetcher"})


def wait_for_threads(before: set[threading.Thread], deadline_s: float) -> None:
    """Wait, up to `deadline_s` in all, for the threads started since `before` to end, before Ray stops. Ray Data's
    (its reader, which nothing joins, finishing the block it was reading when the reader closed) called into Ray
    after ray.shutdown, and Ray's core worker then ended the process ('The core worker has already been shutdown
    ... The process will exit', status 1) while Ray's processes were being stopped, leaving some running: once in
    ~60 stops of `infer --ray` under load here."""
    end = time.monotonic() + deadline_s
    for thread in threading.enumerate():
        if thread not in before and thread is not threading.current_thread() and thread.name not in PARKED_THREADS:
            thread.join(max(0.0, end - time.monotonic()))


def _not_main_thread(record: logging.LogRecord) -> bool:
    """Drops Ray's warning that it set no SIGTERM handler off the main thread: on purpose here."""
    return "SIGTERM handler is not set" not in record.getMessage()


def _kill_and_exit(who: str, why: str, note: str, code: int) -> None:
    """Stop every process this one started (and theirs), say so, exit now (no cleanup runs after this), and have
    them killed once this process is gone.

    They are stopped first (SIGSTOP: none starts another, none finds the others gone). Killed before this process
    exited, the raylet took its object store's socket with it, and this process's Ray core worker thread, finding
    the pipe broken, ended the process with status 1 (CI runs, 2026-12-01: `The connection to the plasma store is
    failed. Terminate the process`, in the driver's log only): before the line was said when the kill came first,
    and after it, 1 time in 14 here under load, when the line came first. The line is the last this process says:
    its streams go to /dev/null first, since Ray Data's thread logged after it."""
    import psutil

    from runtime.atomic_file import discard_staged

    discard_staged()  # an output being written (infer --ray): no finally runs after os._exit
    stopped: dict[int, psutil.Process] = {}
    for _ in range(2):  # again: one may have been starting a process while the first pass stopped
        for child in psutil.Process().children(recursive=True):
            if child.pid not in stopped:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.suspend()
                    stopped[child.pid] = child
    count = f"{len(stopped)} process{'' if len(stopped) == 1 else 'es'}"
    _say_last(f"Error: {who}: {why}: killed the {count} this command had started{note}")
    _kill_once_gone(list(stopped.values()))
    os._exit(code)


def _say_last(line: str) -> None:
    """Say `line` on stderr as this process's last words: what other threads write from here on goes to /dev/null."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or full stream: the line is said all the same
            stream.flush()
    with contextlib.suppress(OSError):  # no stderr (closed): nothing to say it on
        err = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.write(err, (line + "\n").encode("utf-8", "replace"))


# `_kill_once_gone`'s process: deaf to the stop signals, it waits for its stdin to end, then kills its arguments' pids
KILLER = """import os, signal, sys
for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
sys.stdin.buffer.read()
for pid in sys.argv[1:]:
    try:
        os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
"""


def _kill_once_gone(processes: list[psutil.Process]) -> None:
    """Have `processes` (stopped) killed once this process has exited: a process of its own waits for the end of a
    pipe whose other end only this one holds. It runs in a session of its own and ignores the stop signals: started
    from an interactive shell, this command's process group, holding stopped processes, is orphaned as it exits, and
    the kernel sends the group SIGHUP then SIGCONT; a killer in the group died of it, and the Ray workers it was to
    kill (in groups of their own) stayed stopped for good. Where it cannot be started, they are killed now."""
    read, write = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-S", "-c", KILLER, *(str(process.pid) for process in processes)],
                         stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    os.close(read)
    # `write` stays open: it closes as this process exits
