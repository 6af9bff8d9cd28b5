"""The `seq2onnx` group. Each command lives in its own module of this package and is imported on first use, so
`--help` and a greedy `infer` load no torch. Exit codes: see `cli.common`; stops: `cli.signals`."""
from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import os
import sys
from typing import Any, Callable

import click

from runtime import __version__
from runtime.atomic_file import discard_staged
from runtime.errors import RAISED_STOPS, Terminated, clipped, held_signals, out_of_memory

from . import starting_handlers
from .allocator import fewer_arenas_under_a_limit, limited_address_space, unwinder_loaded
from .common import (
    KEPT,
    OUT_OF_MEMORY_SAID,
    PRINTED,
    WRITTEN,
    OutOfMemory,
    no_room_to_load,
    no_temporary_directory,
    onnxruntime_telemetry_off,
    written_so_far,
)
from .options import refuse_repeated_paths
from .signals import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    IN_PROGRAM,
    Interrupted,
    StoppedBySigterm,
    finished,
    hang_up_as_sigterm,
    raise_on_sigterm,
    record_interrupts,
    stopped_by_sigterm,
)
from .streams import StdoutError, guard_standard_streams

# Loaded only when used, so `infer` and `--help` work on an install without torch.
LAZY_COMMANDS = {
    "train": ("cli.train", "train"),
    "export": ("cli.export", "export_command"),
    "verify": ("cli.export", "verify_command"),
    "infer": ("cli.infer", "infer"),
    "eval": ("cli.eval", "eval_command"),
    "bench": ("cli.bench", "bench_command"),
    "serve": ("cli.serve", "serve_command"),
}


COMMAND = "seq2onnx.command"  # ctx.meta: the subcommand being loaded or run, for a message about its stop
AFTER_STOPPED = {"serve": "it had not started serving"}  # the rest say what a stop leaves of their outputs
RETURNS = "_seq2onnx_notes_its_return"  # marks a command's callback wrapped by `_noting_its_return`
RETURNED = False  # the command's callback returned (a stop after it finds the work done)
# the line when even the command's own could not be made, for the program and each command: made at import
NO_MEMORY_LEFT = {name: (f"Error: {name}: out of memory, with none left to say more; under a memory limit (ulimit -v), "
                         "raise it; nothing half-written is left (outputs are published whole or not at all)\n").encode()
                  for name in ("seq2onnx", *LAZY_COMMANDS)}
RUNNING = ["seq2onnx"]  # the command being loaded or run, for that line


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY_COMMANDS:
            return None
        ctx.meta[COMMAND] = RUNNING[0] = name
        module_name, attr = LAZY_COMMANDS[name]
        with held_signals():
            try:
                module = importlib.import_module(module_name)
            except (SystemError, SyntaxError) as exc:
                if not limited_address_space():
                    raise
                # CPython's import, out of memory part-way, said "error return without exception set" (151.5 MB)
                # or a SyntaxError of a line that compiles (152.8 MB): under `ulimit -v` our own modules do load
                raise MemoryError(f"importing {module_name} under a memory limit: {exc}") from None
        command = getattr(module, attr)
        if command.callback is not None and not hasattr(command.callback, RETURNS):
            command.callback = _noting_its_return(command.callback)
            refuse_repeated_paths(command)  # once, as the callback is wrapped once
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand; Ctrl-C anywhere is exit 130 (click's own `Abort` would exit 1), SIGTERM 143. A stop
        that lands once the command's callback returned (while it frees its models, or in the `finally` that stops
        taking signals) finds the work done: exit 0."""
        global RETURNED
        RETURNED = False
        WRITTEN.clear()
        KEPT.clear()
        RAISED_STOPS.clear()  # a command run in this process before (a test's) stopped: not this one
        PRINTED[0] = 0
        try:
            starting_handlers(install=False)  # from here a stop is the command's: KeyboardInterrupt, Terminated
            return self._run(ctx)
        except KeyboardInterrupt as exc:
            if RETURNED:
                return None
            if _command(ctx) == "train" and _quiet_rank():  # a rank other than 0: its rank 0 says it, once for the run
                discard_staged()
                raise click.exceptions.Exit(Interrupted("").exit_code) from None  # (further Ctrl-C ignored)
            raise _stopped(ctx, exc) from None

    def _run(self, ctx: click.Context) -> object:
        restore, unrecord = raise_on_sigterm(), record_interrupts()
        try:
            return super().invoke(ctx)
        except StdoutError as exc:  # its output could not be written (cli.streams): the command's error, said once
            raise click.ClickException(f"{_command(ctx)}: could not write to stdout ({exc.strerror}), so the output there is "
                                       "incomplete or missing (files are written whole or not at all)") from None
        except OSError as exc:
            if no_temporary_directory(exc):  # tempfile found none it could write (ours, or a library's)
                raise click.ClickException(f"{_command(ctx)}: {exc.strerror[0].lower()}{exc.strerror[1:]}: none of them "
                                           "can be written; set TMPDIR to a writable directory") from None
            if out_of_memory(exc):  # CPython's import could not list a directory (ENOMEM under ulimit -v)
                raise _out_of_memory(ctx) from None
            if exc.errno != errno.ENAMETOOLONG:
                raise
            # a path of a name over the file system's limit, met wherever a command looks at one (a check of a
            # --data file, a destination's parent): the user's mistake, said in one line
            name = os.fsdecode(exc.filename) if exc.filename is not None else "a path given"
            raise click.ClickException(f"{clipped(name, 80)}: {exc.strerror}; choose a shorter name") from None
        except (MemoryError, RuntimeError) as exc:  # a process limit (ulimit -v) or the machine's memory (torch's
            if not out_of_memory(exc):  # allocators say it in a RuntimeError); outputs are staged, none is half
                raise
            raise _out_of_memory(ctx) from None
        except (ImportError, SystemError) as exc:  # an extension's import or call that a signal interrupted
            if no_room_to_load(exc):  # a library loaded late, with no room for it
                raise _out_of_memory(ctx) from None
            interrupt = _interrupt_behind(exc)
            if interrupt is not None:
                raise _stopped(ctx, interrupt) from None
            if isinstance(exc, SystemError) and "without exception set" in str(exc) and limited_address_space():
                raise _out_of_memory(ctx) from None  # CPython out of memory part-way through a call (click calling
            raise  # get_command: 150.5 MB of `ulimit -v` on an Intel Xeon, a traceback before)
        finally:
            # Once the command is done its outputs are published: a SIGTERM, SIGHUP or Ctrl-C now must not kill the
            # process (143, 129 or 130, and no word) on its way out
            if IN_PROGRAM:
                finished()
            else:
                restore()
                unrecord()


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM that an extension's failed import or call stands for: its cause or context, a few links
    down (onnxruntime re-raises the import's error from outside the block that caught it, with the stop as cause)."""
    for _ in range(4):
        behind = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if behind is None:
            return None
        if isinstance(behind, KeyboardInterrupt):
            return behind
        exc = behind
    return None


def _noting_its_return(callback: Callable[..., Any]) -> Callable[..., Any]:
    """`callback`, which notes in RETURNED that it returned: from there on the command's work is done."""

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        global RETURNED
        result = callback(*args, **kwargs)
        RETURNED = True  # (a stop whose handler runs before this store counts as one during the command)
        return result

    setattr(run, RETURNS, True)
    return run


def _command(ctx: click.Context) -> str:
    """The command a message names: the subcommand being loaded or run, else the program."""
    return ctx.invoked_subcommand or ctx.meta.get(COMMAND, "seq2onnx")


def _out_of_memory(ctx: click.Context) -> OutOfMemory:
    return OutOfMemory(f"{_command(ctx)}: out of memory; under a memory limit (ulimit -v), raise it; nothing "
                       "half-written is left (outputs are published whole or not at all)")


def _quiet_rank() -> bool:
    """training.torchrun.quiet_rank, imported only for `train` (the other commands load nothing of training)."""
    from training.torchrun import quiet_rank

    return quiet_rank()


def _stopped(ctx: click.Context, interrupt: KeyboardInterrupt) -> Interrupted:
    """The stop's exception, saying what it left; first removes an output sibling whose removal the signal cut."""
    discard_staged()
    name = _command(ctx)
    what = AFTER_STOPPED[name] if name in AFTER_STOPPED else written_so_far()
    stop = StoppedBySigterm if isinstance(interrupt, Terminated) else Interrupted
    return stop(f"{name}: {stop.says}; {what}")


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="seq2onnx")
def main() -> None:
    """Train seq2seq models with attention, export them to ONNX, and run them without torch."""


def _unsaid_unraisable(unraisable: Any) -> None:
    """sys.unraisablehook of the program: running out of memory where Python can only report it (a MemoryError in
    the threading module's shut-down or a __del__; an ENOMEM as torch's exit callback imports a module) is left
    unsaid: a command out of memory has said so in its one line, and one that finished has published its outputs. So is a stop (Ctrl-C, SIGTERM's Terminated) raised where Python can only report it
    (an import lock's weakref callback in a rank stopped as it imports torch): the handler has recorded it and the
    command says it once. Anything else is reported as Python does."""
    value = unraisable.exc_value
    if not (isinstance(value, KeyboardInterrupt) or value is not None and out_of_memory(value)):
        sys.__unraisablehook__(unraisable)


def entry(args: list[str] | None = None) -> None:
    """The `seq2onnx` program. After Ctrl-C, whatever cleanup there is has run when `main` exits 130; the process
    then ends at once with 130, because CPython kills itself with SIGINT at exit (status -2, not 130) when the
    KeyboardInterrupt landed inside code that C extensions run through PyRun_* (torch's exporter does), even
    though our handler caught it."""
    guard_standard_streams()
    try:
        os.getcwd()
    except FileNotFoundError:  # relative paths cannot resolve; torch's import aborted with an MKL 'cannot load'
        click.echo("Error: the working directory no longer exists (it was removed after the shell entered it); "
                   "cd to a directory that exists", err=True)
        sys.exit(1)
    IN_PROGRAM.append(True)
    onnxruntime_telemetry_off()
    fewer_arenas_under_a_limit()  # before any thread allocates
    unwinder_loaded()  # before a daemon thread can need it at exit
    sys.unraisablehook = _unsaid_unraisable
    hang_up_as_sigterm()
    try:
        main(args=args, prog_name="seq2onnx")
    except MemoryError:  # so short that even the command's one line could not be made (click closing its context)
        if not OUT_OF_MEMORY_SAID:  # (else the line was said, and its exit failed on the way up: nothing to add)
            try:  # an output sibling still staged goes (it may need memory too); not contextlib.suppress, an object
                discard_staged()
            except BaseException:  # noqa: S110 (that cannot be made with no memory left)
                pass
            os.write(2, NO_MEMORY_LEFT[RUNNING[0]])
        os._exit(1)
    except StdoutError as exc:  # the group's own --help or --version, printed before any command runs
        click.echo(f"Error: seq2onnx: could not write to stdout ({exc.strerror})", err=True)
        sys.exit(1)
    except SystemExit as exc:
        if OUT_OF_MEMORY_SAID:  # its way on up, and the interpreter's shut-down, could fail out of memory once more
            os._exit(1)  # (the line was flushed as it was shown)
        if exc.code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            raise
        with contextlib.suppress(OSError):  # a stdout that cannot take it: the stop's line said what matters
            sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_TERMINATED if stopped_by_sigterm() else exc.code)
