"""The program's standard streams (`entry` sets them up; a process that calls `main` keeps its own). stderr carries
messages, which a run never fails for: one that cannot be written is dropped. stdout carries results: one that
cannot be written is the command's error, said as such (`StdoutError`), not a traceback or a blamed --out. A
stream closed when the program started is held open on /dev/null the wrong way round, so that its I/O fails as on
a closed stream and no file the program opens takes its number (a server's socket on fd 2 aborted libuv at stop)."""
from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any


class StdoutError(OSError):
    """The command's output could not be written to stdout (a full disk, a reader gone, a closed stdout)."""


def to_null(stream: Any, fd: int) -> None:
    """Point `fd` (`stream`'s) at /dev/null: what it held, and what comes, goes nowhere, and no write fails."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()  # what was buffered for the lost stream, now into /dev/null


class _Stream:
    """A text stream, with what a failed write or flush does decided by the subclass."""

    def __init__(self, stream: Any, fd: int) -> None:
        self._stream, self._fd = stream, fd
        self._empty = b"" if isinstance(stream, (io.RawIOBase, io.BufferedIOBase)) else ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @property
    def buffer(self) -> Any:
        """The binary stream under it, failing the same way: click writes there itself where the text stream's
        encoding is ASCII (a C locale with Python's UTF-8 mode off)."""
        return type(self)(self._stream.buffer, self._fd)

    def write(self, data: Any) -> int:
        if type(data) is type(self._empty) and not data:  # click probes a stream with an empty write and swallows
            return 0  # what it raises: /dev/full refuses even that (one of the other kind still raises TypeError)
        try:
            return self._stream.write(data)
        except OSError as exc:
            self._failed(exc)
            return len(data)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        to_null(self._stream, self._fd)


class _Messages(_Stream):
    """stderr: a message it cannot take is dropped, and the stream goes to /dev/null from then on."""


class _Results(_Stream):
    """stdout: a result it cannot take raises StdoutError; the stream goes to /dev/null, so that what it still holds
    does not fail the process again as it exits."""

    def _failed(self, exc: OSError) -> None:
        super()._failed(exc)
        raise StdoutError(exc.errno, exc.strerror) from None


def guard_standard_streams() -> None:
    """Hold closed standard streams open the wrong way round (reads and writes fail, with EBADF), give Python a
    stream for each, and make stdout's and stderr's failures what the module says."""
    for fd, flags in ((0, os.O_WRONLY), (1, os.O_RDONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, flags)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own, never closed)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), errors="backslashreplace", line_buffering=True)
    sys.stdout = _Results(sys.stdout, 1)
    sys.stderr = _Messages(sys.stderr, 2)
