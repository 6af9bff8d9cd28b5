"""Write a directory whole or not at all: build it beside its destination, then swap it into place.

Shared by checkpoints and exports; each caller brings its own rule for what may be replaced.

The guarantees hold through a SIGKILL at any moment and between concurrent writers:
- one writer per destination: `exclusive(out)` (`runtime.writer_lock`) holds a non-blocking flock on
  `.<name>.lock` beside `out`; a second writer gets `DestinationBusyError` at once instead of racing;
- never a moment without a complete `out`: an existing `out` is swapped with the staged tree in one
  renameat2(RENAME_EXCHANGE) (two renames where the kernel or libc lacks it; see `clean_leftovers`);
- a killed writer's leftovers are hidden siblings with a fixed pattern (`runtime.siblings`), tidied by the next
  writer.

One file whole or not at all: `runtime.atomic_file.write_file`.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from pathlib import Path
from typing import Callable, Iterator

from .errors import check_not_stopped
from .siblings import BACKUP_SUFFIX, STAGING_SUFFIX, remove, sibling
from .writer_lock import DestinationBusyError, exclusive

AT_FDCWD = -100  # <fcntl.h>: paths relative to the working directory
RENAME_EXCHANGE = 2  # <linux/fs.h>: atomically swap two existing paths
EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}  # old kernel, or a filesystem without it
APPEARED = {errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR}  # rename onto something that appeared


@contextlib.contextmanager
def staged_directory(out: Path, check_replace: Callable[[Path], None]) -> Iterator[Path]:
    """Yield an empty dir beside `out`; on success it becomes `out`, on any error it is removed.

    Holds `exclusive(out)` throughout. `check_replace(out)` runs before any work and again just before
    publishing whenever `out` exists; it raises to refuse."""
    out = Path(os.path.abspath(out))
    with exclusive(out):
        if os.path.lexists(out):
            check_replace(out)
        staging = sibling(out, STAGING_SUFFIX)
        try:  # made inside the try: a Ctrl-C that lands as mkdir returns (a stop sent as it appears) removes it too
            staging.mkdir()  # unlike tempfile.mkdtemp (mode 0700), honours the umask: others can read the result
            mode = _take_on(staging, out)
            yield staging
            if mode is not None:
                os.chmod(staging, mode)
            publish(staging, out, check_replace)
        finally:
            remove(staging)


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at `path` now, None where nothing is: the writer holding `path`'s lock, stopped
    while it wrote, tells from a change whether its tree was published (only it can have replaced it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _take_on(staging: Path, out: Path) -> int | None:
    """Where `out` is already a directory (an empty one the caller may use, or an artifact it replaces), the
    staged tree takes on its owner, group and set-group-ID bit now, so that what is written under it gets the
    group it would get under `out`; returns `out`'s mode, for `staging` just before publishing (a directory the
    user made private stays private). The owner and group go as far as this user may give them: a directory of
    another user stays ours (a non-root chown cannot give it away), a group we are not in stays ours."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    for uid, gid in ((st.st_uid, st.st_gid), (-1, st.st_gid)):
        try:
            os.chown(staging, uid, gid)
            break
        except PermissionError:
            continue
    mode = stat.S_IMODE(st.st_mode)
    os.chmod(staging, (mode & stat.S_ISGID) | stat.S_IRWXU | (os.stat(staging).st_mode & 0o777))
    return mode


def publish(staging: Path, out: Path, check_replace: Callable[[Path], None]) -> None:
    """Make `staging` become `out`: a plain rename, or an atomic swap with an existing `out`, then drop the old."""
    check_not_stopped()
    if not os.path.lexists(out):
        _rename_new(staging, out)
        return
    check_replace(out)
    if _exchange(staging, out):
        remove(staging)  # the old tree, now under the staging name: a kill here leaves only a `.tmp`
        return
    _swap_aside(staging, out)


def _rename_new(staging: Path, out: Path) -> None:
    try:
        os.rename(staging, out)  # replaces only an empty directory, never content
    except OSError as err:
        if err.errno not in APPEARED:
            raise
        raise DestinationBusyError(f"{out}: appeared while this run was writing it (written by a process that "
                                   "does not take seq2onnx's lock?); nothing was replaced; check it, then rerun "
                                   "with --force or choose another --out") from None


@functools.lru_cache(maxsize=None)
def _renameat2() -> Callable[..., int] | None:
    """libc's renameat2, or None where libc lacks it (glibc < 2.28, musl, macOS)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the system cannot, so the caller falls back."""
    function = _renameat2()
    if function is None:
        return False
    if function(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in EXCHANGE_UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _swap_aside(staging: Path, out: Path) -> None:
    """Two renames: `out` aside as `.old`, `staging` in; `clean_leftovers` restores the `.old` after a kill."""
    old = sibling(out, BACKUP_SUFFIX)
    os.rename(out, old)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old, out)
        raise
    garbage = sibling(out, STAGING_SUFFIX)
    os.rename(old, garbage)  # once deletion starts the tree is incomplete: it must not be named `.old`
    remove(garbage)
