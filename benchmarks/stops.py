"""Benchmarks stop on Ctrl-C and SIGTERM as `seq2onnx` commands do (cli.signals): exit 130 or 143 with one line, no
traceback, and their temporary directories (exports, converted models) removed on the way out. SIGTERM's default
action killed the process where it stood, leaving those directories behind; click turned Ctrl-C into 'Aborted!'
and exit 1."""
from __future__ import annotations

import signal
from typing import Any

import click

from cli.signals import raise_on_sigterm, stop_for
from runtime.errors import Seq2OnnxError, Terminated


class StoppableCommand(click.Command):
    """A benchmark's click command (`@click.command(cls=StoppableCommand)`) that stops in order on a signal."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        restore = raise_on_sigterm()  # SIGTERM raises Terminated (a KeyboardInterrupt) from here on
        try:
            return super().main(*args, **kwargs)
        finally:
            restore()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # its `with` blocks have run: the temporary directories are gone
            stop = stop_for(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
            raise stop(f"{stop.says}; no figures were kept and the temporary files are removed") from None
        except Seq2OnnxError as exc:  # a model or input the runtime refuses: its one line, as the CLI says it
            raise click.ClickException(str(exc)) from None
