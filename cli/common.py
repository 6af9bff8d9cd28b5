"""What every `seq2onnx` command shares: the exit-code scheme, Ctrl-C as exit 130, what a stop says was written, and
naming the extra to install when an optional dependency is missing (option types and checks: `cli.options`).

Exit codes, the same for every command:
    0    success
    1    the inputs were understood but cannot be used: bad data or model content, a failed check,
         a destination that would lose the user's files, an unavailable provider
    2    usage: an unknown option, a malformed or out-of-range value, a named file that does not exist,
         options that contradict each other (click prints the usage line)
    130  interrupted (Ctrl-C); nothing half-written is left behind
    143  stopped by SIGTERM (a service manager's stop, `kill`): as Ctrl-C, and nothing half-written is left behind;
         also a SIGHUP (the terminal closed), which `hang_up_as_sigterm` passes on as SIGTERM
"""
from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import click

from runtime.atomic import identity
from runtime.errors import RAISED_STOPS, Seq2OnnxError, Terminated, UsageError, one_line

from .streams import to_null

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # as a shell reports a process that SIGTERM ended
IN_PROGRAM: list[bool] = []  # `cli.main.entry` runs: the process ends with the command (not a test calling `main`)
F = TypeVar("F", bound=Callable[..., Any])


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


ORT_TELEMETRY = "ORT_DISABLE_TELEMETRY"  # onnxruntime's own switch, read once when it starts


def onnxruntime_telemetry_off() -> None:
    """The program's processes run onnxruntime with its telemetry off, unless ORT_DISABLE_TELEMETRY says otherwise.
    onnxruntime 1.29+ on Linux and macOS sends usage events (process, sessions, models, errors, run counts) to
    Microsoft by default, keeps a device id and an event cache under ~/.cache/Microsoft/DeveloperTools, and with a
    HOME it cannot write prints a warning at every start: unexpected from a tool that serves and decodes offline.
    Set before onnxruntime is imported (it reads it once); the processes this one starts (torchrun's ranks, a
    local Ray's) inherit it, and a cluster's get it with the job (`cli.cluster.runtime_env`)."""
    os.environ.setdefault(ORT_TELEMETRY, "1")


def say(line: str, err: bool = True) -> None:
    """`click.echo`, for a line the command's result does not depend on (progress, 'wrote ...'). Where the stream
    cannot take it (a full disk behind 2>, a terminal that closed while SIGHUP is ignored), the stream is pointed
    at /dev/null from here on: a lost message made the run fail and lose its output, or exit 1 after writing it."""
    try:
        click.echo(line, err=err)
    except OSError:
        if not IN_PROGRAM:  # a caller of `main` in its own process keeps its streams
            raise
        if err:
            to_null(sys.stderr, 2)
        else:
            to_null(sys.stdout, 1)


WRITTEN: list[str] = []  # what this command has published so far, for the line a stop then prints


def published(path: Any) -> None:
    """Remember that the output at `path` is published (once), so a stop from here on says it was written; also
    from a thread other than the main one (`infer --ray` publishes on its Ray thread)."""
    if str(path) not in WRITTEN:
        WRITTEN.append(str(path))


@contextlib.contextmanager
def publishes(path: Path, shown: Any) -> Iterator[None]:
    """A block that publishes the directory at `path` under its lock (an export): a stop that lands once the tree is
    in place (while the old one is removed, or the lock let go) says `shown` was written, not that nothing was."""
    before = identity(path)
    try:
        yield
    except BaseException:
        if identity(path) not in (None, before):
            published(shown)
        raise


PRINTED = [0]  # results this command has printed to stdout so far (token infer without --output), for the same line


def print_results(lines: Iterable[str]) -> None:
    """Each line (ending in its newline) to stdout as it comes, counted, so a stop from here on says how many. In
    UTF-8 whatever the locale's encoding (JSON Lines are UTF-8; a C or Latin-1 locale could not take a text's
    letters)."""
    for line in lines:
        click.echo(line.encode("utf-8"), nl=False)
        PRINTED[0] += 1


def written_so_far() -> str:
    """What a stop or a kill says of the outputs: those published so far and the results printed to stdout, or
    that nothing was written."""
    shown = (f"printed {PRINTED[0]} result{'' if PRINTED[0] == 1 else 's'} to stdout (a JSON line each)"
             if PRINTED[0] else "")
    if WRITTEN:
        return f"it had {shown + ' and ' if shown else ''}written {', '.join(WRITTEN)}, and nothing else"
    if shown:
        return f"it had {shown}, and written nothing else"
    return "nothing was written (outputs are published whole or not at all)"


def wrote(path: Any, detail: str = "", err: bool = True, last: bool = False) -> None:
    """Say that the output at `path` is published ('wrote PATH' and `detail`), and remember it: a stop from here on
    says it was written. After the `last` output the command is `finished`: what is left is to return."""
    published(path)
    if last:
        finished()  # before the line: a stop sent on reading it must find the signals ignored
    say(f"wrote {path}{detail}", err=err)


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


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then land as they would have: raised inside an extension
    module's import (onnxruntime's, torch's) they came out as an ImportError traceback, exit 1."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if came:
        signal.raise_signal(came[0])  # to the handler that was there before


def stopped_by_sigterm() -> bool:
    """Whether SIGTERM stopped this command (`raise_on_sigterm`)."""
    return signal.SIGTERM in RAISED_STOPS


def no_temporary_directory(exc: OSError) -> bool:
    """Whether `exc` is `tempfile`'s error when none of TMPDIR, /tmp, /var/tmp, /usr/tmp and the working directory
    takes a file (`cli.main` says it in one line, for every command)."""
    return (isinstance(exc, FileNotFoundError) and exc.filename is None and isinstance(exc.strerror, str)
            and exc.strerror.startswith("No usable temporary directory found in"))


NO_ROOM_TO_LOAD = "failed to map segment"  # the loader's ImportError where a memory limit leaves no room for a library


def no_room_to_load(exc: BaseException) -> bool:
    """Whether an ImportError is the loader finding no room (`ulimit -v`) for a library, not a broken install."""
    return isinstance(exc, ImportError) and NO_ROOM_TO_LOAD in str(exc)


def require(modules: tuple[str, ...], needs: str, extra: str, what: str) -> None:
    """Raise a ClickException naming the extra to install when one of `modules` is missing (`what` needs them)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if not isinstance(exc, ModuleNotFoundError) or exc.name != module:  # there, but it would not load
                fix = ("under a memory limit (ulimit -v), raise it" if no_room_to_load(exc)
                       else f"reinstall the '{extra}' extra")
                raise click.ClickException(f"{what} needs {needs} ({module} is installed but could not be "
                                           f"loaded: {one_line(exc)}); {fix}") from None
            raise click.ClickException(  # the module named: of several, one may be missing
                f"{what} needs {needs} ({module} is not installed); install the '{extra}' extra: "
                f"pip install -e '.[cpu,{extra}]' in a seq2onnx checkout"
            ) from None


def require_torch(extra: str = "train", what: str = "this command") -> None:
    """Raise a ClickException naming the extra to install when torch is missing (`what` needs it)."""
    require(("torch",), "PyTorch", extra, what)


def user_errors(command: F) -> F:
    """A command's callback whose library errors end the command as click's do: a `runtime.errors.UsageError`
    is exit 2 with the usage line, any other `Seq2OnnxError` exit 1, each as one line."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as err:
            if err.param is not None:
                raise click.BadParameter(str(err), param_hint=f"'{err.param}'") from None
            raise click.UsageError(str(err)) from None
        except Seq2OnnxError as err:
            raise click.ClickException(str(err)) from None

    return run  # type: ignore[return-value]
