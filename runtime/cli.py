"""`seq2onnx` command line. Commands that need torch live in `training`/`export` and load lazily.

Exit codes, the same for every command:
    0    success
    1    the inputs were understood but cannot be used: bad data or model content, a failed check,
         a destination that would lose the user's files, an unavailable provider
    2    usage: an unknown option, a malformed or out-of-range value, a named file that does not exist,
         options that contradict each other (click prints the usage line)
    130  interrupted (Ctrl-C); nothing half-written is left behind
"""
from __future__ import annotations

import importlib
import math
import os
import signal
import sys
from typing import Any

import click

from . import __version__

EXIT_INTERRUPTED = 130


class Interrupted(click.ClickException):
    """Ctrl-C: exit 130 with one line saying what was kept. Further Ctrl-Cs are ignored from here on: cleanup
    is short, and a signal arriving while the interpreter shuts down (its handlers already reset) would kill
    the process with -SIGINT instead of exiting 130."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        super().__init__(message)


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and +-inf, which pass every range comparison."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"expected a finite number, got {value!r}", param, ctx)
        return number

    def _describe_range(self) -> str:
        # click renders an unbounded range as 'x<=None'; say what is accepted instead
        if self.min is None and self.max is None:
            return "finite"
        return super()._describe_range()


def check_threads_option(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """--threads: 1 up to this machine's usable CPUs (more only oversubscribes the cores)."""
    if value is None:
        return None
    from .sessions import max_threads

    if not 1 <= value <= max_threads():
        raise click.BadParameter(f"expected 1..{max_threads()} (the CPUs this process may use; more threads "
                                 f"only contend for them), got {value}")
    return value


# Loaded only when used, so `infer` and `--help` work on an install without torch.
LAZY_COMMANDS = {
    "train": ("training.cli", "train"),
    "export": ("export.cli", "export_command"),
    "verify": ("export.cli", "verify_command"),
    "infer": ("runtime.infer_cli", "infer"),
    "eval": ("training.eval_cli", "eval_command"),
    "bench": ("export.bench_cli", "bench_command"),
    "serve": ("serving.cli", "serve_command"),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY_COMMANDS:
            return None
        module_name, attr = LAZY_COMMANDS[name]
        return getattr(importlib.import_module(module_name), attr)

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand; Ctrl-C anywhere is exit 130 (click's own `Abort` would exit 1)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            name = ctx.invoked_subcommand or "seq2onnx"
            raise Interrupted(f"{name}: interrupted; nothing was written (outputs are published whole "
                              "or not at all)") from None


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="seq2onnx")
def main() -> None:
    """Train seq2seq models with attention, export them to ONNX, and run them without torch."""


def require(modules: tuple[str, ...], needs: str, extra: str, what: str) -> None:
    """Raise a ClickException naming the extra to install when one of `modules` is missing (`what` needs them)."""
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        raise click.ClickException(
            f"{what} needs {needs}, which is not installed; install the '{extra}' extra: "
            f"pip install -e '.[cpu,{extra}]' in a seq2onnx checkout"
        ) from None


def require_torch(extra: str = "train", what: str = "this command") -> None:
    """Raise a ClickException naming the extra to install when torch is missing (`what` needs it)."""
    require(("torch",), "PyTorch", extra, what)


def entry(args: list[str] | None = None) -> None:
    """The `seq2onnx` program. After Ctrl-C, whatever cleanup there is has run when `main` exits 130; the process
    then ends at once with 130, because CPython kills itself with SIGINT at exit (status -2, not 130) when the
    KeyboardInterrupt landed inside code that C extensions run through PyRun_* (torch's exporter does), even
    though our handler caught it."""
    try:
        main(args=args, prog_name="seq2onnx")
    except SystemExit as exc:
        if exc.code != EXIT_INTERRUPTED:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    entry()
