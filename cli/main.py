"""The `seq2onnx` group. Each command lives in its own module of this package and is imported on first use, so
`--help` and a greedy `infer` load no torch. Exit codes: see `cli.common`."""
from __future__ import annotations

import importlib
import os
import sys

import click

from runtime import __version__
from runtime.errors import Terminated

from .common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Interrupted,
    StoppedBySigterm,
    raise_on_sigterm,
    stopped_by_sigterm,
)

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
        """Run the subcommand; Ctrl-C anywhere is exit 130 (click's own `Abort` would exit 1), SIGTERM 143."""
        restore = raise_on_sigterm()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            name = ctx.invoked_subcommand or "seq2onnx"
            stopped = (StoppedBySigterm, "stopped by SIGTERM") if isinstance(exc, Terminated) else (Interrupted,
                                                                                                 "interrupted")
            raise stopped[0](f"{name}: {stopped[1]}; nothing was written (outputs are published whole or not at "
                             "all)") from None
        finally:
            restore()


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="seq2onnx")
def main() -> None:
    """Train seq2seq models with attention, export them to ONNX, and run them without torch."""


def entry(args: list[str] | None = None) -> None:
    """The `seq2onnx` program. After Ctrl-C, whatever cleanup there is has run when `main` exits 130; the process
    then ends at once with 130, because CPython kills itself with SIGINT at exit (status -2, not 130) when the
    KeyboardInterrupt landed inside code that C extensions run through PyRun_* (torch's exporter does), even
    though our handler caught it."""
    try:
        main(args=args, prog_name="seq2onnx")
    except SystemExit as exc:
        if exc.code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_TERMINATED if stopped_by_sigterm() else exc.code)
