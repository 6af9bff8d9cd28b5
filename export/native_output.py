"""What torch.onnx's C++ side writes straight to the process's file descriptors, kept to what a user should read.

It bypasses Python's `sys.stdout`/`sys.stderr` and `warnings`, so only the descriptors themselves can be steered.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import IO

# Written by torch's shape inference for every recurrent encoder over padded sources (pack_padded_sequence): ONNX's
# GRU/LSTM take the lengths themselves, and export's parity checks and symbolic-dims checks run on the saved graph,
# so "may result in wrong shape inference" is checked there, not left to the reader.
BENIGN_NATIVE_WARNINGS = re.compile(rb"The shape inference of prim::(PackPadded|PadPacked) type is missing")


@contextlib.contextmanager
def quiet_native_stdout() -> Iterator[None]:
    """File descriptor 1 to /dev/null for the block: when an operator cannot be exported, torch.onnx's C++ side
    prints the whole TorchScript graph there (70 lines and more) before raising; the error names what failed. For
    the export's duration only (it is not a server's concern)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def benign_native_warnings_dropped() -> Iterator[None]:
    """File descriptor 2 held in an anonymous file for the block, then written back to it without the lines of
    BENIGN_NATIVE_WARNINGS: everything else (Python's warnings and tracebacks, other native lines) comes out in
    its order, at the block's end. Where no temporary file can be made, the block runs with stderr as it is."""
    try:
        held = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    with held:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(held.fileno(), 2)
            with _crashes_told_to(saved):
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            _write_back(held)


@contextlib.contextmanager
def _crashes_told_to(fd: int) -> Iterator[None]:
    """faulthandler on `fd` (the real stderr) for the block: a process that dies in it (an abort or a segfault in
    native code) takes what it held with it, and would otherwise end without a word."""
    was_enabled = faulthandler.is_enabled()
    with os.fdopen(os.dup(fd), "w") as real:
        faulthandler.enable(file=real, all_threads=True)
        try:
            yield
        finally:
            _restore_faulthandler(was_enabled)


def _restore_faulthandler(was_enabled: bool) -> None:
    """Enabled on stderr again where it was on, else off: never left on the descriptor about to be closed, whose
    number another file may take. (Where it was on elsewhere, stderr is the nearest place this can tell.)"""
    faulthandler.disable()
    if not was_enabled:
        return
    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.enable(file=stream, all_threads=True)
            return
        except (AttributeError, ValueError, OSError):  # no descriptor behind it (a test's capture, None)
            continue


def _write_back(held: IO[bytes]) -> None:
    held.seek(0)
    kept = b"".join(line for line in held if not BENIGN_NATIVE_WARNINGS.search(line))
    if not kept:
        return
    with contextlib.suppress(OSError, ValueError):  # a stderr that cannot take it: messages are dropped, as elsewhere
        sys.stderr.flush()
        while kept:
            kept = kept[os.write(2, kept):]
