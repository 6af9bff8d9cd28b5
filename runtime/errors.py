"""Typed errors of the runtime. Each message names the input, what was expected and what was given."""
from __future__ import annotations

import contextlib
import errno
import math
import signal
import threading
from collections.abc import Iterator


class Seq2OnnxError(Exception):
    """Base class of every error seq2onnx raises on purpose."""


class ManifestError(Seq2OnnxError, ValueError):
    """manifest.json is missing, malformed, or of a format version this runtime does not know."""


class IntegrityError(Seq2OnnxError, OSError):
    """A graph file is missing, altered, truncated, or does not belong to this export."""


class InputError(Seq2OnnxError, ValueError):
    """An input to `predict` has the wrong rank, shape, dtype or values."""


class UsageError(Seq2OnnxError, ValueError):
    """Options that contradict each other or ask for what the model cannot do (the CLI's exit 2, with usage).
    `param` names the option at fault ('--data'), when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Cancelled(Seq2OnnxError, RuntimeError):
    """A decode stopped between two steps because its caller's `cancel` said so (a deadline passed, the client
    went away); nothing was returned."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a service manager's stop, `kill`, torchrun stopping its ranks), raised where Ctrl-C's
    KeyboardInterrupt would be: a KeyboardInterrupt, so whatever handles Ctrl-C (say what was kept, leave nothing
    half-written) handles it too."""


RAISED_STOPS: list[int] = []  # the signals a program's handlers raised as a stop: see `check_not_stopped`


def check_not_stopped() -> None:
    """Raise the stop (Terminated, or KeyboardInterrupt for Ctrl-C) where one was raised before and swallowed: Python
    ignores an exception raised inside a weakref callback or a __del__ (importlib's module locks have one), so a
    SIGTERM or Ctrl-C landing there was lost and the command went on to publish its output. Called right before an
    output is published."""
    if RAISED_STOPS:
        raise KeyboardInterrupt() if RAISED_STOPS[0] == signal.SIGINT else Terminated()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then land as they would have: raised inside an extension
    module's import (onnxruntime's, torch's) they came out as an ImportError traceback, exit 1; raised inside a
    save of the training state they cut it, and an epoch trained was lost. In the main thread only (elsewhere the
    block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if came:
        signal.raise_signal(came[0])  # to the handler that was there before


class MissingExtraError(Seq2OnnxError, RuntimeError):
    """An optional dependency (an extra of the install) that this use needs is not installed."""


class VocabError(Seq2OnnxError, ValueError):
    """A vocabulary (built, loaded or rebuilt from a dict) is malformed, or an id is out of range."""


class TokenizerUnavailableError(Seq2OnnxError, ImportError):
    """A subword vocabulary needs the `tokenizers` package, which is not installed."""


class ProviderError(Seq2OnnxError, RuntimeError):
    """The requested execution provider cannot run on this machine or install."""


class ResourceError(Seq2OnnxError, OSError):
    """The process could not get threads or memory: its limits (ulimit) or the machine's, not its input."""


# what torch's allocators put in the RuntimeError of an allocation refused ('std::bad_alloc', "DefaultCPUAllocator:
# can't allocate memory")
TORCH_OUT_OF_MEMORY = ("std::bad_alloc", "can't allocate memory")


# a library's ImportError where a memory limit leaves no room for it: the loader's, or its own start-up's (a pybind11
# module's init throwing, as onnxruntime's did under `ulimit -v 150000`)
NO_ROOM_TO_LOAD = ("failed to map segment", "std::bad_alloc")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says the process found no memory: a MemoryError, torch's RuntimeError of a refused allocation,
    an OSError ENOMEM (CPython's import listing a directory under `ulimit -v`), or an ImportError of a library the
    loader found no room for."""
    if isinstance(exc, ImportError):
        return any(sign in str(exc) for sign in NO_ROOM_TO_LOAD)
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOMEM
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError)
                                            and any(sign in str(exc) for sign in TORCH_OUT_OF_MEMORY))


RUN_FAILED_ADVICE = "; pass a smaller batch or shorter sources"  # what a decode short of memory needs


def short_of_memory(what: str, exc: MemoryError) -> ResourceError:
    """numpy's MemoryError in a decode (the search's arrays, the outputs) as the ResourceError that onnxruntime's
    failure to allocate for a run is (runtime.binding), naming `what`: one error for a decode the process's memory
    cannot hold, wherever it ran out. (A try block, not a context manager: free where nothing is raised.)"""
    return ResourceError(f"{what}: the decode needs more memory than this process has free "
                         f"({one_line(exc) or 'MemoryError'}){RUN_FAILED_ADVICE}")


BRIEF_CHARS = 200  # longest repr of a caller's value quoted in a message: a long path fits, a big array does not


def one_line(text: object) -> str:
    """Text (a numpy repr, an onnxruntime error) folded onto one line."""
    return " ".join(line.strip() for line in str(text).splitlines())


def clipped(text: str, limit: int) -> str:
    """`text`, or where it is longer than `limit` its start and its length, for a message that quotes a caller's
    long string (a path, a number's digits)."""
    return text if len(text) <= limit else f"{text[: limit // 2]}... ({len(text)} characters)"


def int_text(value: int) -> str:
    """An int as a message quotes it: its digits, or past NUMBER_BITS bits its size (Python makes no string of more
    than 4,300 digits: an f-string of a caller's 10**5000 raised ValueError in place of the message)."""
    bits = abs(value).bit_length()
    if bits <= NUMBER_BITS:
        return str(value)
    return f"{'a negative' if value < 0 else 'an'} int of about {math.floor(bits * math.log10(2)) + 1} digits"


NUMBER_BITS = 128


def brief(value: object) -> str:
    """A one-line repr of a caller's value, cut to BRIEF_CHARS, for error messages."""
    try:
        text = int_text(value) if type(value) is int else one_line(repr(value))
    except Exception:  # a caller's object whose __repr__ fails still gets named
        text = f"<{type(value).__name__}>"
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 3] + "..."


def is_count(value: object, minimum: int = 0) -> bool:
    """Whether `value` is an int (never a bool) of at least `minimum`: a size, an id or an axis."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum
