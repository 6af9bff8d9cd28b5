"""torch.save to a file, with a failed write said as what it is."""
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
