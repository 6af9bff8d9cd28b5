"""One writer per destination: `exclusive(out)` holds a non-blocking flock on `.<name>.lock` beside `out`, so a
second writer, in another process or another thread, gets `DestinationBusyError` at once instead of racing.

Taking the lock afresh also tidies what a killed writer left beside `out` (`runtime.siblings.clean_leftovers`):
only a lock holder may, since no live writer then owns those names.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import Seq2OnnxError
from .siblings import LOCK_SUFFIX, clean_leftovers, stem

LOCK_FILE_MODE = 0o666  # the umask decides, as for the published files
LOCK_ATTEMPTS = 100  # each retry means another holder released meanwhile; give up rather than spin forever


class DestinationBusyError(Seq2OnnxError, OSError):
    """Another writer holds the destination, or wrote it while we were staging ours."""


class DestinationUnwritableError(Seq2OnnxError, OSError):
    """The destination's lock cannot be made: no permission there, a read-only file system, a directory in the way."""


@dataclass
class _Hold:
    fd: int
    owner: int  # thread id: reentrancy is per thread; another thread is another writer
    depth: int
    made: list[Path]  # the directories above `out` that taking the lock created, deepest first


_HOLDS: dict[Path, _Hold] = {}
_HOLDS_LOCK = threading.Lock()


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
        made = _missing_directories(lock.parent)
        _HOLDS[key] = _Hold(_flock(out, lock), me, 1, made)
        return True


def _missing_directories(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not os.path.lexists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _flock(out: str | Path, lock: Path) -> int:
    """An fd holding LOCK_EX on the file now named `lock`, or DestinationBusyError (held by another writer) or
    DestinationUnwritableError (the lock cannot be made there at all: no permission, a read-only file system, a
    directory that cannot be made, a file system that takes no new files)."""
    for _ in range(LOCK_ATTEMPTS):
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
        except FileNotFoundError:  # another writer's release removed a parent it had made, as we made ours
            continue
        except OSError as exc:  # the directory the lock goes in, or one above it, is what cannot be made
            raise _unwritable(out, lock, f"{exc.strerror or exc} making the directory {exc.filename or lock.parent}"
                              ) from None
        try:
            return _flock_made(out, lock)
        except DestinationBusyError:
            raise
        except FileNotFoundError:  # another writer's release removed the parent it had made, between our two calls
            continue
        except OSError as exc:
            raise _unwritable(out, lock, exc.strerror or str(exc)) from None
    # every attempt failed with no such file: not a race with another writer's release but a file system that
    # makes nothing there (/proc answers so)
    if lock.parent.is_dir():
        raise _unwritable(out, lock, f"{lock.parent} takes no new files")
    there = lock.parent
    while not there.is_dir() and there.parent != there:
        there = there.parent
    raise _unwritable(out, lock, f"{there} takes no new directories")


def _unwritable(out: str | Path, lock: Path, why: str) -> DestinationUnwritableError:
    return DestinationUnwritableError(f"{out}: cannot be written: its lock {lock} cannot be made ({why}); "
                                      "choose another --out")


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
        if not os.path.lexists(key):  # nothing was published: the directories made for it go too, while empty
            for directory in hold.made:
                try:
                    os.rmdir(directory)
                except OSError:  # not empty (a run's .partial state, another writer's files), or not ours to remove
                    break
