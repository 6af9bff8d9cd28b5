"""Write a directory whole or not at all: build it beside its destination, then rename it into place.

Shared by checkpoints and exports; each caller brings its own rule for what may be replaced."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator


def sibling(path: Path, suffix: str) -> Path:
    """A fresh hidden name beside `path` (same filesystem, so renames are atomic)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{suffix}")


@contextlib.contextmanager
def staged_directory(out: Path, check_replace: Callable[[Path], None]) -> Iterator[Path]:
    """Yield an empty dir beside `out`; on success it becomes `out`, on any error it is removed.

    `check_replace(out)` runs before any work and again just before publishing whenever `out` exists;
    it raises to refuse. An old `out` is moved aside, restored if the final rename fails, then deleted."""
    out = Path(out).absolute()
    if out.exists():
        check_replace(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = sibling(out, ".tmp")
    staging.mkdir()  # unlike tempfile.mkdtemp (mode 0700), honours the umask: others can read the result
    try:
        yield staging
        publish(staging, out, check_replace)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, out: Path, check_replace: Callable[[Path], None]) -> None:
    """Rename `staging` to `out`, moving an existing `out` aside first and removing it only afterwards."""
    if not out.exists():
        os.rename(staging, out)
        return
    check_replace(out)
    old = sibling(out, ".old")
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
