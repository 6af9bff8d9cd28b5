"""What callers pass to a point model's `predict`, checked strictly before onnxruntime sees anything (onnxruntime does
not check symbolic dims, and a wrong shape there is a crash or garbage), and its outputs checked for overflow. Each
refusal is an InputError naming the input, what was expected and what was given, in the caller's terms (lists by
their shape and what they hold, arrays by their dtype)."""
from __future__ import annotations

import functools
import numbers
from collections import deque
from typing import Any

import numpy as np

from .defaults import MAX_TARGET_LEN
from .errors import InputError, brief, one_line
from .spec import ModelSpec

FLOAT32_MAX = float(np.finfo(np.float32).max)  # larger finite values become inf in float32
FLOAT32_RANGE = f"±{FLOAT32_MAX:.1e}".replace("e+", "e")  # '±3.4e38'
NUMBER_KINDS = "fiu"  # float, signed and unsigned int: JSON has no int/float distinction, all are cast to float32
MASK_VALUES = (0, 1)


# what nested lists hold, by the kind of the array numpy makes of them: a caller who sent lists (JSON's arrays
# included) never named a numpy dtype
HOLDING = {"U": "strings", "S": "bytes", "b": "true/false", "c": "complex numbers", "f": "numbers", "i": "numbers",
           "u": "numbers", "O": "values other than numbers (null, objects, mixed types or integers beyond int64)"}


def _describe(arr: np.ndarray, given: Any = None) -> str:
    """An array by its shape and dtype; lists by their shape and what they hold; a value numpy could only wrap as
    one element (a dict, None, a str) by its type."""
    if arr.ndim == 0 and not isinstance(given, np.ndarray):  # one value, not an array (5, "ab", None, a dict)
        if given is None:
            return "None"
        name = type(given).__name__
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({brief(given)})"
    if isinstance(given, (list, tuple)):
        held = HOLDING.get(arr.dtype.kind, f"dtype {arr.dtype}") if arr.size else "nothing"
        return f"a list of shape {tuple(arr.shape)}, holding {held}"
    if arr.dtype.kind == "O" and arr.ndim:  # what a caller's object array may hold that numpy stores as numbers
        return f"shape {tuple(arr.shape)} dtype object (Python objects: mixed types, None or integers beyond int64)"
    return f"shape {tuple(arr.shape)} dtype {arr.dtype}"


def _as_array(value: Any, name: str, expected: str) -> np.ndarray:
    """np.asarray, with ragged or too-deeply-nested lists (and numbers numpy cannot hold, and a torch tensor that
    will not give its values: one that requires grad raises a RuntimeError) as InputError."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError, RecursionError, RuntimeError) as exc:
        ragged = _ragged(value, name)
        got = (f"lists of different lengths: {ragged}" if ragged is not None else
               f"{brief(value)}, which numpy cannot turn into an array ({one_line(exc)})")
        raise InputError(f"{name}: expected {expected}; got {got}; pass nested lists of equal lengths or a numpy "
                         "array") from None


RAGGED_LOOK = 100_000  # items looked at to find where nested lists differ (past it, numpy's own words are given)


def _ragged(value: Any, name: str) -> str | None:
    """Where nested lists first differ in length or depth, in reading order ('source[0][1] has 1 item where
    source[0][0] has 2'), or None (not lists, or too many items to look at)."""
    if not isinstance(value, (list, tuple)):
        return None
    first: dict[int, tuple[str, int | None]] = {}  # depth -> (the first item there, its length; None: not a list)
    queue = deque([(name, value, 0)])
    looked = 0
    while queue:
        path, item, depth = queue.popleft()
        looked += 1
        size = len(item) if isinstance(item, (list, tuple)) else None
        where, expected = first.setdefault(depth, (path, size))
        if size != expected:
            return f"{path} has {_items(size)} where {where} has {_items(expected)}"
        if size is not None:
            if looked + len(queue) + size > RAGGED_LOOK:
                return None
            queue.extend((f"{path}[{i}]", sub, depth + 1) for i, sub in enumerate(item))
    return None


def _items(size: int | None) -> str:
    return "a single value" if size is None else f"{size} item{'' if size == 1 else 's'}"


def _holds_bool(value: Any) -> bool:
    """Whether nested lists hold a bool among numbers (numpy would quietly read True as 1.0)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (bool, np.bool_)):
            return True
        if isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def check_source(source: Any, spec: ModelSpec) -> np.ndarray:
    """Return source as a C-contiguous float32 (N, L, F) array, or raise InputError."""
    if isinstance(source, np.ma.MaskedArray):  # np.asarray would drop its mask without a word
        raise InputError("source: got a numpy masked array, whose mask this model does not read; pass the data "
                         "(source.filled(0)) and mark padding with source_mask (True for a real point)")
    if isinstance(source, (list, tuple)) and len(source) == 0:  # no sources: JSON's [] has no inner shape to read
        return np.zeros((0, 1, spec.n_features), np.float32)  # (0, L, F), as a batch 0 array gives
    arr = _as_array(source, "source", f"a numeric array of shape (N, L, {spec.n_features})")
    if arr.dtype.kind in NUMBER_KINDS and isinstance(source, (list, tuple)) and _holds_bool(source):
        raise InputError("source: expected numbers, got true/false among them; pass 1.0/0.0 if that is meant")
    if arr.dtype.kind not in NUMBER_KINDS:
        raise InputError(
            f"source: expected floating-point or integer values (cast to float32), got {_describe(arr, source)}; "
            "pass numbers, not bool, complex, text, dates or objects"
        )
    if arr.ndim != 3 or arr.shape[2] != spec.n_features:
        raise InputError(
            f"source: expected shape (batch, source_len, {spec.n_features}), got {_describe(arr, source)}"
            + (f"; one source of shape (L, {spec.n_features}) needs a batch axis: (1, L, {spec.n_features}), "
               "source[None] in numpy" if arr.ndim == 2 and arr.shape[1] == spec.n_features else "")
        )
    if arr.shape[1] < 1:
        raise InputError(f"source: expected source_len >= 1, got {_describe(arr, source)}")
    with np.errstate(over="ignore"):  # overflow is reported below, by value and batch item
        out = np.ascontiguousarray(arr, dtype=np.float32)
    _check_finite(arr, out)
    return out


def _all_finite(values: np.ndarray) -> bool:
    """Whether a float32 array holds no NaN/Inf (no errstate block, which cost more than the test, run cold beside a
    batch-1 decode, and no warning where both infinities are in it)."""
    return bool(np.isfinite(values).all())


def _check_finite(given: np.ndarray, cast: np.ndarray) -> None:
    """Refuse NaN/Inf, and finite values that overflow float32, naming the first one's batch item."""
    if _all_finite(cast):
        return
    bad = ~np.isfinite(cast)
    index = tuple(np.argwhere(bad)[0])
    value, item = given[index], int(index[0])
    if np.isfinite(value):
        shown = f"{float(value):g}" if np.isfinite(float(value)) else str(value)  # longdouble beyond float64
        raise InputError(
            f"source: value {shown} in batch item {item} exceeds the float32 range "
            f"({FLOAT32_RANGE}) the model computes in; scale the data into range"
        )
    raise InputError(f"source: expected finite values, got NaN or Inf (first in batch item {item})")


def check_target_len(target_len: Any, spec: ModelSpec) -> int:
    """Return the number of points to decode: the spec's default, or a sane positive int."""
    if target_len is None:
        return spec.target_len
    if type(target_len) is int and 1 <= target_len <= MAX_TARGET_LEN:  # the usual case, before the slow ABC check
        return target_len
    if isinstance(target_len, bool) or not isinstance(target_len, numbers.Integral):
        raise InputError(f"target_len: expected an int in [1, {MAX_TARGET_LEN}] or None, got {brief(target_len)}")
    if not 1 <= int(target_len) <= MAX_TARGET_LEN:
        raise InputError(f"target_len: expected an int in [1, {MAX_TARGET_LEN}] or None, got "
                         f"{brief(int(target_len))}")
    return int(target_len)


def check_mask(source_mask: Any, source: np.ndarray) -> np.ndarray:
    """Return a bool (N, 1, L) mask: all True when None; (N, L) and 0/1 ints or floats are accepted too."""
    n, length = source.shape[:2]
    if source_mask is None or (n == 0 and isinstance(source_mask, (list, tuple)) and len(source_mask) == 0):
        return _full_mask(n, length) if n * length <= SHARED_MASK_SIZE else np.ones((n, 1, length), dtype=bool)
    if isinstance(source_mask, np.ma.MaskedArray):  # np.asarray would drop its own mask without a word
        raise InputError("source_mask: got a numpy masked array, whose mask is not read; pass plain True/False (or "
                         "1/0) values, True for a real point")
    mask = _as_array(source_mask, "source_mask", f"a bool or 0/1 array of shape ({n}, 1, {length})")
    if mask.dtype != bool and mask.dtype.kind not in NUMBER_KINDS:
        raise InputError(f"source_mask: expected bool or 0/1 numbers, got {_describe(mask, source_mask)}; "
                         "pass True/False or 1/0")
    if mask.shape == (n, length):
        mask = mask[:, None, :]  # (N, 1, L)
    if mask.shape != (n, 1, length):
        raise InputError(f"source_mask: expected shape ({n}, {length}) or ({n}, 1, {length}) to match source, got "
                         f"{_describe(mask, source_mask)}")
    if mask.dtype != bool:
        valid = np.isin(mask, MASK_VALUES)
        if not valid.all():
            index = tuple(np.argwhere(~valid)[0])
            raise InputError(
                f"source_mask: expected only 0 and 1 values, got {brief(mask[index].item())} in item {int(index[0])}; "
                "use 1 for a real point and 0 for padding"
            )
        mask = mask.astype(bool)
    if n and not mask.all():  # a full mask (the usual case): nothing to look for
        _check_padding(mask[:, 0, :])
    return np.ascontiguousarray(mask)


def _check_padding(mask: np.ndarray) -> None:
    """Each row of a bool (N, L) mask must be 1s then 0s: the encoder reads every position up to the last valid one,
    so padding before or between real points would be encoded as points (a result no unpadded source gives)."""
    empty = ~mask.any(axis=-1)
    if empty.any():
        raise InputError(
            f"source_mask: every item needs at least one valid position; item {int(np.argmax(empty))} has none"
        )
    gaps = mask[:, 1:] & ~mask[:, :-1]  # a 1 right after a 0
    if gaps.any():
        item, after = (int(i) for i in np.argwhere(gaps)[0])
        zero = int(np.flatnonzero(~mask[item, :after + 1])[0])
        raise InputError(
            f"source_mask: expected each item right-padded (1s for its points, then 0s for padding), got item {item} "
            f"with a 0 at position {zero} before a 1 at position {after + 1}; put the padding at the end"
        )


SHARED_MASK_SIZE = 1 << 16  # the most points an all-valid mask made once and shared (read-only) may cover


@functools.lru_cache(maxsize=256)
def _full_mask(n: int, length: int) -> np.ndarray:
    """A read-only all-True (n, 1, length) mask, made once per shape: a decode without source_mask makes no array.
    Over immutable bytes, so that no one can make it writeable again (numpy refuses)."""
    return np.frombuffer(b"\x01" * (n * length), dtype=bool).reshape(n, 1, length)


def check_outputs(source: np.ndarray, outputs: np.ndarray, attention: np.ndarray | None) -> None:
    """Finite inputs can still overflow inside the model (e.g. 1e30 everywhere): refuse rather than return NaN."""
    arrays = (outputs, attention) if attention is not None else (outputs,)
    if all(_all_finite(arr) for arr in arrays):
        return
    bad = np.zeros(len(outputs), dtype=bool)  # (N,)
    for arr in arrays:
        bad |= ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)  # (N,)
    if bad.any():
        item = int(np.argmax(bad))
        raise InputError(
            f"source: batch item {item} (largest |value| {float(np.abs(source[item]).max()):.3g}) made the model's "
            "outputs overflow to NaN/Inf; the values are far outside the range it was trained on, scale them down"
        )
