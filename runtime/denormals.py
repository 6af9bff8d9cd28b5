"""Denormal floats flushed to zero while seq2onnx's graphs run, on the threads that run them, and nowhere else.

A masked attention's softmax takes exp of -inf (or of onnxruntime's -10000 mask value) minus the row's max. MLAS's
exp builds such a result as a denormal on its way to 0, and on Intel CPUs without flush-to-zero every denormal
result is a microcode assist: on a Xeon with AMX (the 2-core VM of the README's figures), a (16, 4, 4, 52) softmax
with a third of it masked took 76 us against 11 us with none masked, and 150 us when the masked scores sat 87-100
below the max, where the results are denormal rather than 0. The beam graph's ancestry mask (k - 1 of every k cache
slots masked) and the wide greedy loop's blocks (3 of 4 inputs' keys masked) pay it every step. With the flags set
the same softmax took 11 us in every case. (The AMD EPYC of the README's older figures was not measured this way;
the batch-64 decodes that pay this most ran faster than CTranslate2 there, and 1.3-1.8x slower on the Xeon.)

Flushing is what the CPU does when MXCSR's FTZ (results) and DAZ (inputs) bits are set, for the thread that sets
them. So: sessions are made with onnxruntime's `session.set_denormal_as_zero`, which sets the bits on its worker
threads (intra-op threads >= 2); the thread that calls a decode of more than one row (inputs x beams, or a point
model's batch of more than one source or with a padded mask) sets them for the decode's length (`flushing`) and puts
its own flags back after, since onnxruntime runs part of every call (all of it at 1 thread) on the caller's thread,
and a service's threads must not change how the rest of its code rounds. A decode of one row skips that: it reads no
mask (no padding, no blocks), and the libm calls, ~2 us in a tight loop, made the greedy batch-1 call 1.2-1.7%
slower (run just after a graph, with Python's and ctypes' code out of the caches, four of them took ~40 us on an AMD
EPYC; a block now makes three, ~10 us, and keeps no per-thread state). onnxruntime also sets or clears the bits,
for good, on the thread that makes the process's first session (as that session's option says); `keeping_flags`
undoes that around session creation. A thread started during a flushed decode inherits the bits: the cancel
watchdog clears them when it starts (`clear_on_this_thread`). The bits
are read and written with C's fegetenv/fesetenv through ctypes, on x86-64 Linux with glibc, whose fenv_t ends with
the MXCSR word (musl's is laid out the same, untested); a check on first use turns the feature off where setting the
bits does not flush. Elsewhere (macOS, Windows, ARM) nothing is flushed and sessions are made without the option, so
no thread is changed behind its owner's back.

What changes: during such a decode, everything on the calling thread (onnxruntime's share of the work, the Python
search between steps, a `cancel` callback) treats float32 values under 1.2e-38 and float64 values under 2.2e-308 as
0, and the floating-point exception flags raised meanwhile are dropped with the restore. Softmax weights that small
(a key e^-87 below the best) add nothing a float32 sum can hold, so decoded ids and scores are those of the export's
parity checks.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from typing import Any

import numpy as np

DENORMAL_AS_ZERO = "session.set_denormal_as_zero"  # onnxruntime's session option for its worker threads
FLUSH_BITS = 0x8040  # MXCSR: FTZ (bit 15) and DAZ (bit 6)
FENV_BYTES, MXCSR_OFFSET = 32, 28  # x86-64 fenv_t: the x87 environment (28 bytes), then the MXCSR word
LIBM = "libm.so.6"  # glibc's libm on x86-64 Linux, by its soname
FLUSH = True  # seq2onnx flushes where it can; False runs every decode with the thread's own flags


class _Fenv(ctypes.Structure):
    _fields_ = [("x87", ctypes.c_uint8 * MXCSR_OFFSET), ("mxcsr", ctypes.c_uint32)]


class _Flags:
    """The calling thread's floating-point environment, through libm; `works` is False where it cannot be used."""

    def __init__(self) -> None:
        self._works: bool | None = None  # found out on first use: nothing is touched at import

    @property
    def works(self) -> bool:
        if self._works is None:
            self._works = self._load() and self._check()
        return self._works

    def _load(self) -> bool:
        if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
            return False
        if ctypes.sizeof(_Fenv) != FENV_BYTES:
            return False
        try:  # glibc's soname first: find_library runs /sbin/ldconfig in a child process (~10 ms, and a process
            libm = ctypes.CDLL(LIBM)  # that a supervisor watching this one's group sees come and go)
        except OSError:
            name = ctypes.util.find_library("m")
            if name is None:
                return False
            try:
                libm = ctypes.CDLL(name)
            except OSError:
                return False
        self._get, self._set = libm.fegetenv, libm.fesetenv
        for function in (self._get, self._set):  # called with ctypes.byref(a _Fenv) only: no argtypes to convert
            function.restype = ctypes.c_int  # through (3 cold calls took 19 us with them, 12.5 without)
        return True

    def _check(self) -> bool:
        """Whether the bits really flush on this thread (so the fenv_t layout is the one assumed): a float32
        product under 1.2e-38 comes out as a denormal with them cleared and as 0 with them set, whatever this
        thread had before (put back after)."""
        saved = _Fenv()
        if self._get(ctypes.byref(saved)) != 0:
            return False
        try:
            trial = _Fenv.from_buffer_copy(saved)
            trial.mxcsr &= ~FLUSH_BITS
            self._set(ctypes.byref(trial))
            kept = not flushes_now()
            trial.mxcsr |= FLUSH_BITS
            self._set(ctypes.byref(trial))
            return kept and flushes_now()
        finally:
            self._set(ctypes.byref(saved))

    def enter(self) -> Any:
        """Set FTZ and DAZ on this thread; returns what `exit` needs to put the thread's flags back, or None where
        there is nothing to put back (the bits were set already: an outer `flushing` block, or the thread's own
        choice). Three libm calls a block, its own buffer (threads and nested blocks each hold theirs)."""
        env = _Fenv()
        ref = ctypes.byref(env)
        if self._get(ref) != 0:
            return None
        mxcsr = env.mxcsr
        if mxcsr & FLUSH_BITS == FLUSH_BITS:
            return None
        env.mxcsr = mxcsr | FLUSH_BITS
        self._set(ref)
        env.mxcsr = mxcsr  # what exit puts back: the environment as it was (exception flags raised since dropped)
        return ref

    def exit(self, saved: Any) -> None:
        if saved is not None:
            self._set(saved)


class flushing:  # noqa: N801 (a context manager, named for the `with` line it reads in)
    """`with flushing():` runs its block with denormals flushed on this thread, then restores the thread's flags;
    `flushing(False)` leaves them (a decode of one row). A block inside another finds the bits set and leaves them
    to the outer one."""

    __slots__ = ("_saved", "_wanted")

    def __init__(self, wanted: bool = True) -> None:
        self._wanted, self._saved = wanted, []  # a stack: one object may be entered again inside itself

    def __enter__(self) -> None:
        self._saved.append(FLAGS.enter() if self._wanted and FLUSH and FLAGS.works else None)

    def __exit__(self, *exc: object) -> None:
        saved = self._saved.pop()
        if saved is not None:
            FLAGS.exit(saved)


class keeping_flags:  # noqa: N801
    """`with keeping_flags():` puts this thread's floating-point flags back after its block (onnxruntime sets or
    clears FTZ/DAZ, for good, on the thread that makes the process's first session, as that session's
    DENORMAL_AS_ZERO says)."""

    __slots__ = ("_saved",)

    def __enter__(self) -> None:
        self._saved = _Fenv() if FLAGS.works else None
        if self._saved is not None and FLAGS._get(ctypes.byref(self._saved)) != 0:
            self._saved = None

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            FLAGS._set(ctypes.byref(self._saved))


def clear_on_this_thread() -> None:
    """Clear FTZ/DAZ on this thread for good: for a thread seq2onnx starts itself (the cancel watchdog), which
    inherits the flags of the thread that starts it, perhaps in the middle of a flushed decode."""
    if FLAGS.works:
        env = _Fenv()
        if FLAGS._get(ctypes.byref(env)) == 0:
            env.mxcsr &= ~FLUSH_BITS
            FLAGS._set(ctypes.byref(env))


def session_flag() -> dict[str, str]:
    """The session config entry that flushes on onnxruntime's worker threads (where FLUSH, and where the thread
    that makes the session can be restored), read when a session is made."""
    return {DENORMAL_AS_ZERO: "1"} if FLUSH and FLAGS.works else {}


def flushes_now() -> bool:
    """Whether this thread flushes denormals at this moment (a float32 product under 1.2e-38 comes out 0)."""
    return float((np.array([1e-38], np.float32) * np.float32(0.01))[0]) == 0.0


FLAGS = _Flags()
