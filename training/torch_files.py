"""torch.save to a file and torch.load from one, with a failure said as what it is, in one line."""
from __future__ import annotations

import errno
import io
from pathlib import Path
from typing import Any

import torch

from runtime.atomic_file import write_file


def save_torch(path: Path, obj: Any, error: type[OSError], atomic: bool = False) -> None:
    """torch.save(obj) to `path` (through a sibling and a rename when `atomic`). The bytes are made in memory and
    written by Python: torch's own writer turned a failed write (a file size limit, a full disk) into 'RuntimeError:
    [enforce fail at inline_container.cc] unexpected pos', where Python's OSError says it; raised as `error`."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    try:
        if atomic:
            write_file(path, lambda f: f.write(buffer.getbuffer()))
        else:
            path.write_bytes(buffer.getbuffer())
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG or isinstance(exc, error):  # (the command names a path too long)
            raise
        raise error(f"{str(path)!r} could not be written ({exc.strerror or exc}); free space, or raise the file size "
                    "limit (ulimit -f), then rerun") from None


def load_torch(path: Path, what: str, fix: str, error: type[OSError]) -> Any:
    """torch.load with weights_only=True; any failure is one line raised as `error` (torch's own is many, with
    unsafe advice)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zips, foreign pickles, random bytes: torch raises several types
        raise error(f"{what} {str(path)!r} cannot be read as PyTorch tensors ({type(err).__name__}: "
                    f"truncated, corrupted, or not written by seq2onnx); {fix}") from None
