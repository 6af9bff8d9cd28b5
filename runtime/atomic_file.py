"""Write one file whole or not at all: `write_file` stages it as a hidden sibling, `.<name>.<12 hex>.tmp`
(`runtime.siblings.sibling`), then makes it the file in one step. The CLI's and the benchmarks' outputs, vocabularies
and checkpoint files go through it; each caller brings its own rule for what may be replaced
(`runtime.destination`).

The staged sibling is removed on any error; a writer killed mid-write leaves it behind, and no later writer removes
another's (it may be a live one's). A process about to end itself at once (`os._exit`: `cli.ray_stop`'s kill), or
stopped by a signal (whose exception can land inside the removal itself), removes its own with `discard_staged`.
"""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import check_not_stopped
from .siblings import STAGING_SUFFIX, sibling

_STAGED: set[Path] = set()  # this process's siblings being written


def discard_staged() -> None:
    """Remove the siblings this process is writing now: for a process that ends itself with `os._exit`, where no
    `finally` runs."""
    for tmp in list(_STAGED):
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def staged(tmp: Path) -> Iterator[None]:
    """`tmp`, a sibling this process creates and removes inside the block, counts as staged while it runs: a stop
    whose exception lands in the block leaves it registered for `discard_staged` (the program's stop runs it)."""
    _STAGED.add(tmp)
    yield
    _STAGED.discard(tmp)


def write_file(path: str | Path, write: Callable[[BinaryIO], None], replace: bool = True) -> None:
    """Write one file whole or not at all: `write` fills a fresh hidden sibling (permissions as the umask says),
    which then becomes `path` in one step; on any failure the sibling is removed and `path` is untouched. With
    `replace` False a file that is at `path` by then (one that appeared while `write` ran, after the caller found
    none) is kept: FileExistsError, nothing written."""
    path = Path(path)
    tmp = sibling(path, STAGING_SUFFIX)
    _STAGED.add(tmp)
    try:
        with open(tmp, "xb") as f:
            write(f)
        check_not_stopped()
        if replace:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        _STAGED.discard(tmp)  # not reached when a signal's exception lands inside the removal (a SIGTERM as a failed
        raise  # read is cleaned up): the sibling stays registered, for the program's stop to remove
    _STAGED.discard(tmp)


def _publish_new(tmp: Path, path: Path) -> None:
    """`tmp` becomes `path` only if nothing is there: a hard link fails on an existing name (no window), then the
    sibling goes; on a file system without hard links, a look then a rename."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "a file appeared there while it was being written", str(path)) from None
    except OSError:
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "a file appeared there while it was being written",
                                  str(path)) from None
        os.replace(tmp, path)
        return
    tmp.unlink()
