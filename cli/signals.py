"""How a command stops: Ctrl-C as exit 130 and SIGTERM (and SIGHUP, passed on as SIGTERM) as 143, each raised where
the main thread is so that cleanup runs and nothing half-written is left; a stop recorded so that one Python
swallowed is still honoured before anything is published; signals held across an extension's import, and ignored
once the command's outputs are published."""
from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from typing import Any, Callable

import click

from runtime.errors import RAISED_STOPS, Terminated

from .streams import to_null

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # as a shell reports a process that SIGTERM ended
IN_PROGRAM: list[bool] = []  # `cli.main.entry` runs: the process ends with the command (not a test calling `main`)


class Interrupted(click.ClickException):
    """Ctrl-C: exit 130 with one line saying what was kept. Further Ctrl-Cs are ignored from here on: cleanup
    is short, and a signal arriving while the interpreter shuts down (its handlers already reset) would kill
    the process with -SIGINT instead of exiting 130."""

    exit_code = EXIT_INTERRUPTED
    says = "interrupted"  # how a message names the stop

    def __init__(self, message: str) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        super().__init__(message)


class StoppedBySigterm(Interrupted):
    """Stopped by SIGTERM: exit 143, with the same line saying what was kept."""

    exit_code = EXIT_TERMINATED
    says = "stopped by SIGTERM"


def stop_for(signum: int) -> type[Interrupted]:
    """The stop a signal makes: SIGTERM's, else Ctrl-C's."""
    return StoppedBySigterm if signum == signal.SIGTERM else Interrupted


def raise_on_sigterm() -> Callable[[], None]:
    """From here on SIGTERM raises `Terminated` wherever this (the main) thread is, as Ctrl-C raises
    KeyboardInterrupt, so every command stops as it does on Ctrl-C: cleanup runs, nothing half-written is left
    (the default action killed the process at once, leaving an output's temporary sibling behind). Once: the
    process is on its way out, and further SIGTERMs are ignored. Returns what puts the previous handler back.
    Commands that serve or launch put handlers of their own over it while they run."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, _terminated)
    return lambda: signal.signal(signal.SIGTERM, previous)


def hang_up_as_sigterm() -> None:
    """From here on SIGHUP (the terminal closed, an SSH session dropped) is passed on to this process as SIGTERM,
    so a command stops in order, as it does on `kill`: SIGHUP's default action killed it at once, which left an
    output's temporary sibling behind, and a training run's state unsaved. A SIGHUP that was ignored when the
    process started (`nohup`) stays ignored. Main thread only, like every signal handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return
    signal.signal(signal.SIGHUP, _hung_up)


def _hung_up(signum: int, frame: Any) -> None:
    quiet_a_closed_terminal()
    signal.raise_signal(signal.SIGTERM)  # to whatever handles SIGTERM now (a server's stop, a rank's), or ignores it


def quiet_a_closed_terminal() -> None:
    """stdout and stderr on a terminal that has closed go to /dev/null: every write there fails (EIO), and the
    stop's last line failing made Python exit 1 ('lost sys.stderr') instead of 143. A terminal still open, a file
    or a pipe is left as it is."""
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            os.write(fd, b"")
        except OSError as exc:
            if exc.errno == errno.EIO:
                to_null(stream, fd)


def finished() -> None:
    """The command's outputs are published and it is on its way out (its sessions and models being freed): from
    here on SIGTERM, SIGHUP and Ctrl-C no longer stop it, so a signal now neither says that nothing was written nor
    ends it with 143 or 130 (or dies of SIGHUP or SIGINT as the interpreter shuts down). In the program only
    (`entry`): a test calling `main` keeps its handlers."""
    if IN_PROGRAM and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def _terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    RAISED_STOPS.append(signum)  # an interrupted command exits 143, not 130, and publishes nothing after it
    raise Terminated()


def record_interrupts() -> Callable[[], None]:
    """From here on Ctrl-C raises KeyboardInterrupt as Python's own handler does, and is recorded as a SIGTERM is,
    so that one raised where Python swallows it (a weakref callback) still stops the command before it publishes
    (`runtime.errors.check_not_stopped`). Only over Python's own handler: an ignored Ctrl-C stays ignored. Returns
    what puts Python's handler back, unless another took its place meanwhile."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return lambda: None
    signal.signal(signal.SIGINT, _interrupted)

    def restore() -> None:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    return restore


def _interrupted(signum: int, frame: Any) -> None:
    RAISED_STOPS.append(signum)
    raise KeyboardInterrupt()


def stopped_by_sigterm() -> bool:
    """Whether SIGTERM stopped this command (`raise_on_sigterm`)."""
    return signal.SIGTERM in RAISED_STOPS
