"""What every `seq2onnx` command shares: the exit-code scheme, what a stop says was written, messages that never fail
a run, and naming the extra to install when an optional dependency is missing (option types and checks:
`cli.options`; Ctrl-C as exit 130 and SIGTERM as 143: `cli.signals`).

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
import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import click

from runtime.atomic import identity
from runtime.errors import Seq2OnnxError, UsageError, held_signals, one_line, out_of_memory

from .signals import IN_PROGRAM, finished
from .streams import to_null

F = TypeVar("F", bound=Callable[..., Any])


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
KEPT: list[str] = []  # what a stop leaves as it was that the user may want next (a run's saved state), for that line


def kept(note: str) -> None:
    """Add `note` (what is left as it was, and what to do with it) to what a stop says, after what was written."""
    if note not in KEPT:
        KEPT.append(note)


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
    that nothing was written; then what was `kept`."""
    return "; ".join([_written(), *KEPT])


def _written() -> str:
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


def no_temporary_directory(exc: OSError) -> bool:
    """Whether `exc` is `tempfile`'s error when none of TMPDIR, /tmp, /var/tmp, /usr/tmp and the working directory
    takes a file (`cli.main` says it in one line, for every command)."""
    return (isinstance(exc, FileNotFoundError) and exc.filename is None and isinstance(exc.strerror, str)
            and exc.strerror.startswith("No usable temporary directory found in"))


class OutOfMemory(click.ClickException):
    """A command's one line saying memory ran out. Once shown, the process ends at once (`cli.main.entry`): with
    the address space spent, even the SystemExit that follows can fail on its way up (a traceback object that
    cannot be allocated turns it into a MemoryError, printed as a traceback after the line)."""

    def show(self, file: Any = None) -> None:
        super().show(file)
        OUT_OF_MEMORY_SAID.append(True)


OUT_OF_MEMORY_SAID: list[bool] = []  # an OutOfMemory line was written: the command's exit is that line, and status 1


def no_room_to_load(exc: BaseException) -> bool:
    """Whether an ImportError is the loader finding no room (`ulimit -v`) for a library, not a broken install."""
    return isinstance(exc, ImportError) and out_of_memory(exc)


def require(modules: tuple[str, ...], needs: str, extra: str, what: str) -> None:
    """Raise a ClickException naming the extra to install when one of `modules` is missing (`what` needs them).
    Ctrl-C and SIGTERM wait for each import: torch's start-up calls back into Python from C++ (torch.distributed's
    `_c10d_init`), and a stop raised there aborted the process (exit 134, a C++ 'terminate called' traceback)."""
    for module in modules:
        try:
            with held_signals():
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
