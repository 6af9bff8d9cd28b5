"""A model directory's files as the runtime reads them: regular files only, never more than a bound, and their
sha256 (the manifest records one for every graph and vocabulary)."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Callable

from .errors import Seq2OnnxError, clipped

# O_NOFOLLOW: a link swapped in after the lstat check still fails; O_NONBLOCK: opening a FIFO cannot hang.
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
READ_CHUNK = 1 << 20  # what a file that grows past its size is read on in


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def check_sha256(path: Path, data: bytes, expected: str, error: type[Seq2OnnxError]) -> None:
    """`data` (read from `path`) hashes to the manifest's `expected` sha256, else `error` giving both."""
    actual = sha256_bytes(data)
    if actual != expected:
        raise error(f"{path}: sha256 {actual[:16]}... does not match the manifest's {expected[:16]}...; the file was "
                    "altered or truncated, re-export the model")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's contents, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular_file(path: Path, max_bytes: int, error: type[Seq2OnnxError],
                      missing: str | Callable[[], str]) -> bytes:
    """A regular file's bytes, at most max_bytes; a link, FIFO, device, directory or larger file raises `error`. A
    missing file raises `error` with `missing` (a callable: made only then)."""
    try:
        link = path.is_symlink()
    except (OSError, ValueError) as exc:  # a name too long for the file system, ...
        raise error(f"{clipped(str(path), 200)}: cannot be opened ({getattr(exc, 'strerror', None) or exc}); check "
                    "the path") from None
    if link:
        raise error(f"{path}: is a symbolic link; a model's files must be regular files inside its directory, "
                    "copy the real file in place of the link")
    try:
        fd = os.open(path, OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        raise error(f"{path}: {missing() if callable(missing) else missing}") from None
    except (OSError, ValueError) as exc:  # permissions, a link raced in (ELOOP), a NUL byte in the path
        raise error(f"{path}: cannot be opened ({exc}); check the path and its permissions") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is not a regular file (mode {stat.filemode(mode)}); "
                        "a model's files must be regular files, re-export the model")
        data = _read_at_most(fd, max_bytes + 1, path, error)  # never more: the file may be huge, or growing
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path}: larger than the {max_bytes}-byte limit; this is not a file seq2onnx wrote, "
                    "re-export the model")
    return data


def _read_at_most(fd: int, limit: int, path: Path, error: type[Seq2OnnxError]) -> bytes:
    """Up to `limit` bytes from an open file; an I/O error raises `error`. Asks for no more memory than the file
    holds (`f.read(limit)` reserved the whole limit first: 2 GiB for a graph, which a memory limit refused)."""
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(min(limit, os.fstat(fd).st_size + 1))  # its size, and a byte more if it grew since
            while len(data) < limit:  # it is growing, or its size said less than it holds (a /proc file)
                more = f.read(min(limit - len(data), READ_CHUNK))
                if not more:
                    return data
                data += more
            return data
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc}); check the disk and re-export the model") from None
