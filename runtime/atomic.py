"""Write a directory whole or not at all: build it beside its destination, then swap it into place.

Shared by checkpoints and exports; each caller brings its own rule for what may be replaced.

The guarantees hold through a SIGKILL at any moment and between concurrent writers:
- one writer per destination: `exclusive(out)` holds a non-blocking flock on `.<name>.lock` beside `out`;
  a second writer gets `DestinationBusyError` at once instead of racing;
- never a moment without a complete `out`: an existing `out` is swapped with the staged tree in one
  renameat2(RENAME_EXCHANGE) (two renames where the kernel or libc lacks it; see `clean_leftovers`);
- a killed writer's leftovers are hidden siblings with a fixed pattern, tidied by the next writer.
Names beside `out`: `.<name>.lock` (the lock), `.<name>.<12 hex>.tmp` (staging, or an old tree being
deleted: garbage), `.<name>.<12 hex>.old` (only in the two-rename fallback: a complete previous `out`).

One file whole or not at all: `runtime.atomic_file.write_file`.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import Seq2OnnxError

UUID_HEX_CHARS = 12  # length of the random part of a sibling's name
STAGING_SUFFIX = ".tmp"
BACKUP_SUFFIX = ".old"
LOCK_SUFFIX = ".lock"
LOCK_FILE_MODE = 0o666  # the umask decides, as for the published files
LOCK_ATTEMPTS = 100  # each retry means another holder released meanwhile; give up rather than spin forever
AT_FDCWD = -100  # <fcntl.h>: paths relative to the working directory
RENAME_EXCHANGE = 2  # <linux/fs.h>: atomically swap two existing paths
EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}  # old kernel, or a filesystem without it
APPEARED = {errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR}  # rename onto something that appeared
NAME_MAX = 255  # bytes in one name on Linux's file systems
# a sibling's marks around its stem: '.', '.', the random hex and the longest suffix (a lock's name has fewer)
SIBLING_MARKS = 2 + UUID_HEX_CHARS + max(len(s) for s in (STAGING_SUFFIX, BACKUP_SUFFIX, LOCK_SUFFIX))


class DestinationBusyError(Seq2OnnxError, OSError):
    """Another writer holds the destination, or wrote it while we were staging ours."""


class DestinationUnwritableError(Seq2OnnxError, OSError):
    """The destination's lock cannot be made: no permission there, a read-only file system, a directory in the way."""


@dataclass
class _Hold:
    fd: int
    owner: int  # thread id: reentrancy is per thread; another thread is another writer
    depth: int


_HOLDS: dict[Path, _Hold] = {}
_HOLDS_LOCK = threading.Lock()


def stem(name: str) -> str:
    """The part of a sibling's name that stands for `name`: `name` itself, or, where `name` leaves no room for the
    sibling's marks within NAME_MAX bytes, its start and a hash of the whole (so a file of a valid long name can
    still be written through a sibling)."""
    raw = os.fsencode(name)
    room = NAME_MAX - SIBLING_MARKS
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:8]
    cut = room - len(digest) - 1
    while cut and raw[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
        cut -= 1
    return os.fsdecode(raw[:cut]) + "~" + digest


def sibling(path: Path, suffix: str) -> Path:
    """A fresh hidden name beside `path` (same filesystem, so renames are atomic)."""
    return path.with_name(f".{stem(path.name)}.{uuid.uuid4().hex[:UUID_HEX_CHARS]}{suffix}")


def lock_file(out: str | Path) -> Path:
    """The hidden lock file guarding `out`: `.<name>.lock` beside it."""
    key = _canonical(out)
    return key.with_name(f".{stem(key.name)}{LOCK_SUFFIX}")


def _canonical(out: str | Path) -> Path:
    """One key for every spelling of `out`: parent resolved, the last name kept (it is what gets replaced)."""
    out = Path(os.path.abspath(out))
    return out.parent.resolve() / out.name


def _busy(out: str | Path, lock: Path, who: str = "another seq2onnx process") -> DestinationBusyError:
    return DestinationBusyError(f"{out}: {who} is writing it (lock {lock} held); wait for it to finish "
                                "or choose another --out")


@contextlib.contextmanager
def exclusive(out: str | Path) -> Iterator[Path]:
    """Hold the writer's lock on `out` (non-blocking, reentrant per thread) and tidy a killed writer's leftovers.

    Raises DestinationBusyError when another process or thread holds it. Yields the lock file's path."""
    key, lock = _canonical(out), lock_file(out)
    if _acquire(key, out, lock):
        try:
            clean_leftovers(out)  # safe only now: we hold the lock, so no live writer owns those names
        except BaseException:
            _release(key, lock)
            raise
    try:
        yield lock
    finally:
        _release(key, lock)


def _acquire(key: Path, out: str | Path, lock: Path) -> bool:
    """Take or re-enter the hold on `key`; True when this call took the lock afresh."""
    me = threading.get_ident()
    with _HOLDS_LOCK:
        hold = _HOLDS.get(key)
        if hold is not None:
            if hold.owner != me:
                raise _busy(out, lock, "another thread of this process")
            hold.depth += 1
            return False
        _HOLDS[key] = _Hold(_flock(out, lock), me, 1)
        return True


def _flock(out: str | Path, lock: Path) -> int:
    """An fd holding LOCK_EX on the file now named `lock`, or DestinationBusyError (held by another writer) or
    DestinationUnwritableError (the lock cannot be made there at all: no permission, a read-only file system)."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return _flock_made(out, lock)
    except DestinationBusyError:
        raise
    except OSError as exc:
        raise DestinationUnwritableError(f"{out}: cannot be written: its lock {lock} cannot be made "
                                         f"({exc.strerror or exc}); choose another --out") from None


def _flock_made(out: str | Path, lock: Path) -> int:
    for _ in range(LOCK_ATTEMPTS):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(out, lock) from None
        except BaseException:
            os.close(fd)
            raise
        if _names_same_file(lock, fd):
            return fd
        os.close(fd)  # a holder unlinked it between our open and flock; whoever created the new file competes
    raise _busy(out, lock)


def _names_same_file(path: Path, fd: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _release(key: Path, lock: Path) -> None:
    with _HOLDS_LOCK:
        hold = _HOLDS[key]
        hold.depth -= 1
        if hold.depth:
            return
        del _HOLDS[key]
        # Unlink while still locked: a process that opened this inode meanwhile finds it unlinked and retries.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(hold.fd)


def _leftover_pattern(out: Path) -> re.Pattern[str]:
    suffixes = "|".join(re.escape(s) for s in (STAGING_SUFFIX, BACKUP_SUFFIX))
    return re.compile(rf"\.{re.escape(stem(out.name))}\.[0-9a-f]{{{UUID_HEX_CHARS}}}({suffixes})")


def leftovers(out: str | Path) -> list[Path]:
    """Our hidden siblings of `out` (`.<name>.<12 hex>.tmp` / `.old`); nothing else matches."""
    out = Path(os.path.abspath(out))
    pattern = _leftover_pattern(out)
    try:
        names = os.listdir(out.parent)
    except FileNotFoundError:
        return []
    return sorted(out.parent / name for name in names if pattern.fullmatch(name))


def clean_leftovers(out: str | Path) -> None:
    """Remove a killed writer's staging and backup siblings; first restore `out` from a backup if it is missing.

    Call it holding `exclusive(out)`. A missing `out` beside an `.old` means a kill between the two renames of
    the fallback publish: the `.old` is the complete previous `out` (one being deleted is renamed `.tmp` first)."""
    out = Path(os.path.abspath(out))
    stale = leftovers(out)
    backups = [p for p in stale if p.name.endswith(BACKUP_SUFFIX)]
    if backups and not os.path.lexists(out):
        newest = max(backups, key=lambda p: p.lstat().st_ctime)  # a rename sets ctime: the last one moved aside
        os.rename(newest, out)
        stale.remove(newest)
    for path in stale:
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def staged_directory(out: Path, check_replace: Callable[[Path], None]) -> Iterator[Path]:
    """Yield an empty dir beside `out`; on success it becomes `out`, on any error it is removed.

    Holds `exclusive(out)` throughout. `check_replace(out)` runs before any work and again just before
    publishing whenever `out` exists; it raises to refuse."""
    out = Path(os.path.abspath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out):
        if os.path.lexists(out):
            check_replace(out)
        staging = sibling(out, STAGING_SUFFIX)
        staging.mkdir()  # unlike tempfile.mkdtemp (mode 0700), honours the umask: others can read the result
        try:
            yield staging
            publish(staging, out, check_replace)
        finally:
            _remove(staging)


def publish(staging: Path, out: Path, check_replace: Callable[[Path], None]) -> None:
    """Make `staging` become `out`: a plain rename, or an atomic swap with an existing `out`, then drop the old."""
    if not os.path.lexists(out):
        _rename_new(staging, out)
        return
    check_replace(out)
    if _exchange(staging, out):
        _remove(staging)  # the old tree, now under the staging name: a kill here leaves only a `.tmp`
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
    _remove(garbage)
