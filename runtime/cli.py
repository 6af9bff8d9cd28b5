"""`seq2onnx` command line. Commands that need torch live in `training`/`export` and load lazily."""
from __future__ import annotations

import importlib

import click

from . import __version__

# Loaded only when used, so `infer` and `--help` work on an install without torch.
LAZY_COMMANDS = {
    "train": ("training.cli", "train"),
    "export": ("export.cli", "export_command"),
    "verify": ("export.cli", "verify_command"),
    "infer": ("runtime.infer_cli", "infer"),
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


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="seq2onnx")
def main() -> None:
    """Train seq2seq models with attention, export them to ONNX, and run them without torch."""


def require_torch(extra: str = "train") -> None:
    """Raise a ClickException naming the extra to install when torch is missing."""
    try:
        importlib.import_module("torch")
    except ImportError:
        raise click.ClickException(
            f"this command needs PyTorch, which is not installed; install the '{extra}' extra: "
            f"pip install 'seq2onnx[cpu,{extra}]'"
        ) from None


if __name__ == "__main__":
    main()
