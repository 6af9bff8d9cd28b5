"""The benchmarks' file outputs (--json, --plot), by the CLI's rule: checked before any work
(`runtime.destination.check_output_file`), written whole or not at all, and over a file that appeared during the
run only with --force. A refusal is one line: exit 1 for a file already there (a destination that would lose it),
2 for a path that cannot be used, as `seq2onnx` commands do."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import BinaryIO, Callable, NoReturn

import click

from runtime.atomic_file import write_file
from runtime.destination import OutputFileError, check_output_file

JSON, PNG = (".json",), (".png",)


def check_click(path: str | Path | None, flag: str, force: bool, suffixes: tuple[str, ...]) -> None:
    """A click script's --json/--plot (None: not asked for): click's errors."""
    refused = refusal(path, force, suffixes)
    if refused is not None and refused.exists:
        raise click.ClickException(f"{flag}: {refused}")
    if refused is not None:
        raise click.BadParameter(str(refused), param_hint=f"'{flag}'")


def check_args(parser: argparse.ArgumentParser, path: Path | None, flag: str, force: bool,
               suffixes: tuple[str, ...]) -> None:
    """An argparse script's --json/--plot (None: not asked for): parser.error for an unusable path."""
    refused = refusal(path, force, suffixes)
    if refused is not None and refused.exists:
        refuse(f"{flag}: {refused}")
    if refused is not None:
        parser.error(f"{flag} {refused}")


def refusal(path: str | Path | None, force: bool, suffixes: tuple[str, ...]) -> OutputFileError | None:
    """Why `path` cannot take the output (runtime.destination.check_output_file), or None (also when None)."""
    try:
        if path is not None:
            check_output_file(path, force, suffixes)
    except OutputFileError as exc:
        return exc
    return None


def publish(path: str | Path, force: bool, write: Callable[[BinaryIO], None]) -> None:
    """Write the file whole (runtime.atomic_file.write_file); a file that appeared there during the run is kept unless
    `force`; any failure is one line, exit 1, with nothing written there."""
    try:
        write_file(path, write, replace=force)
    except FileExistsError:
        refuse(f"{path}: a file appeared there while this ran; it was kept and nothing was written (pass --force "
               "to replace it)")
    except OSError as exc:
        refuse(f"{path}: could not be written ({exc.strerror or exc}); nothing was written there")


def refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)
