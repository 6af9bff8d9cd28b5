"""The point models' side of `seq2onnx infer`: reading --input (.npy, .npz, JSON, or JSON on stdin) into sources and an
optional mask, bounded in size and strict about what it accepts; each refusal is one line naming the input."""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import click
import numpy as np

from runtime import strict_json
from runtime.errors import RUN_FAILED_ADVICE

from .common import OutOfMemory


class InputFileError(click.ClickException):
    """The --input file cannot be read as sources (one line, no usage text)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"--input: {message}")

    @classmethod
    def of(cls, input_path: str, exc: Exception | str) -> InputFileError:
        """What the file holds (its shape, values, mask) refused, named with the file ('-': stdin)."""
        return cls(f"{'stdin' if input_path == '-' else input_path}: {exc}")

    @classmethod
    def short_of_memory(cls, input_path: str, exc: Exception, steps: int) -> InputFileError:
        """A decode of the file's sources that the process's memory could not hold, with what to change."""
        return cls.of(input_path, f"{str(exc).removesuffix(RUN_FAILED_ADVICE)}; pass fewer or shorter sources, or a "
                                  f"smaller --target-len (this one was {steps})")


def results_too_large(outputs: np.ndarray, attention: np.ndarray | None) -> OutOfMemory:
    """Decoded results that the memory left cannot hold as JSON text (numbers take ~20 bytes a piece there)."""
    count = outputs.size + (0 if attention is None else attention.size)
    return OutOfMemory(f"the results ({count} numbers) need more memory as JSON text than this process has "
                       "free; write them with --output FILE.npy or FILE.npz (binary), or pass fewer sources or a "
                       "smaller --target-len")


# JSON has no size or depth limit of its own; these keep a hostile or mistaken input from exhausting memory.
MAX_JSON_BYTES = 64 << 20
JSON_KEYS = ("source", "source_mask")
NPY_MAGIC = b"\x93NUMPY"


def read_input(path: str) -> tuple[Any, Any]:
    """(source, source_mask or None) from .npy, .npz (key 'source'), JSON, or '-' (JSON on stdin)."""
    if path == "-":
        try:
            data = _read_bounded(sys.stdin.buffer, "stdin")
        except OSError as exc:  # a closed stdin (EBADF), a terminal gone (EIO)
            raise InputFileError(f"stdin could not be read ({exc.strerror or exc})") from None
        return parse_json(data, "stdin")
    suffix = Path(path).suffix.lower()
    if suffix not in (".npy", ".npz", ".json"):
        raise InputFileError(f"{path}: expected a .npy, .npz or .json file, or '-' for JSON on stdin")
    try:
        with open(path, "rb") as f:
            if suffix == ".json":
                return parse_json(_read_bounded(f, path), path)
            if suffix == ".npy":
                return _read_npy(f, path), None
            return _read_npz(f, path)
    except OSError as exc:
        raise InputFileError(f"{path} could not be read ({exc.strerror or exc})") from None


def _read_bounded(stream: Any, where: str) -> bytes:
    data = stream.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise InputFileError(f"{where}: JSON input is larger than {MAX_JSON_BYTES >> 20} MiB; "
                             "pass large batches as .npy or .npz, or split them")
    return data


def _read_npy(f: Any, path: str) -> np.ndarray:
    if f.read(len(NPY_MAGIC)) != NPY_MAGIC:
        raise InputFileError(f"{path}: not a NumPy .npy file (no .npy header); write it with numpy.save, "
                             "or pass the data as .json")
    f.seek(0)
    try:
        return np.load(f, allow_pickle=False)
    except ValueError as exc:
        raise InputFileError(f"{path}: {_numpy_problem(exc)}") from None


def _read_npz(f: Any, path: str) -> tuple[np.ndarray, np.ndarray | None]:
    if not zipfile.is_zipfile(f):
        raise InputFileError(f"{path}: not a NumPy .npz archive (not a zip file); write it with numpy.savez")
    f.seek(0)
    try:
        with np.load(f, allow_pickle=False) as data:
            unknown = sorted(set(data.files) - set(JSON_KEYS))
            if "source" not in data.files or unknown:
                raise InputFileError(f"{path} has arrays {sorted(data.files)}; expected 'source' and optionally "
                                     "'source_mask', nothing else")
            return data["source"], data["source_mask"] if "source_mask" in data.files else None
    except (ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputFileError(f"{path}: {_numpy_problem(exc)}") from None


def _numpy_problem(exc: Exception) -> str:
    """numpy's refusal of pickled objects suggests allow_pickle=True (unsafe); say what it means instead."""
    if "pickle" in str(exc):
        return "holds Python objects (pickled data), which are never loaded; save a plain numeric array"
    return f"cannot be read as NumPy arrays ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def parse_json(data: bytes, where: str) -> tuple[Any, Any]:
    """JSON: nested lists (N, L, F), or {"source": ..., "source_mask": ...} and no other keys."""
    if not data.strip():
        raise InputFileError(f"{where}: is empty; expected JSON nested lists (N, L, F) or an object with 'source'")
    try:
        doc = strict_json.loads(data, wide_ints_as_floats=True)  # as HTTP's float fields
    except strict_json.JsonRefused as exc:
        raise InputFileError(f"{where}: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputFileError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply; expected nested lists (N, L, F)") from None
    if isinstance(doc, dict):
        unknown = sorted(set(doc) - set(JSON_KEYS))
        if "source" not in doc or unknown:
            raise InputFileError(f"{where}: JSON object has keys {sorted(doc)}; understood keys are "
                                 f"{list(JSON_KEYS)}, 'source' required (options such as --target-len are "
                                 "command-line flags)")
        return doc["source"], doc.get("source_mask")
    return doc, None
