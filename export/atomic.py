"""Build a directory beside its destination, then move it into place in one rename."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from runtime.contract import MANIFEST_FILE

from .errors import DestinationExistsError


def check_destination(out: Path, force: bool) -> None:
    """Refuse to touch an existing destination unless forced, and never replace a non-export."""
    if not out.exists():
        return
    if not force:
        raise DestinationExistsError(f"{out}: already exists; pass --force (force=True) to replace it")
    is_export = out.is_dir() and (out / MANIFEST_FILE).is_file()
    if not (is_export or (out.is_dir() and not any(out.iterdir()))):
        raise DestinationExistsError(
            f"{out}: exists and is not a seq2onnx export (no {MANIFEST_FILE}); refusing to replace it even with "
            "--force, choose another --out"
        )


@contextlib.contextmanager
def staged_directory(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temp dir beside `out`; on success it replaces `out`, on any error it is removed."""
    out = Path(out).absolute()
    check_destination(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield staging
        check_destination(out, force)  # it may have appeared meanwhile
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
