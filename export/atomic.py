"""What an export may replace: nothing without force, and never a directory that is not an export."""
from __future__ import annotations

from pathlib import Path

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
