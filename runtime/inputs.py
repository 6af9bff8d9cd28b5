"""Strict checks on what callers pass to `predict`, before onnxruntime sees anything
(onnxruntime does not check symbolic dims, and a wrong shape there is a crash or garbage)."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .errors import InputError
from .spec import ModelSpec

MAX_TARGET_LEN = 10_000


def _describe(arr: np.ndarray) -> str:
    return f"shape {tuple(arr.shape)} dtype {arr.dtype}"


def check_source(source: Any, spec: ModelSpec) -> np.ndarray:
    """Return source as a C-contiguous float32 (N, L, F) array, or raise InputError."""
    try:
        arr = np.asarray(source)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise InputError(f"source: expected a numeric array of shape (N, L, {spec.n_features}); {exc}") from None
    if arr.dtype.kind != "f":
        raise InputError(
            f"source: expected floating-point values (float32, or float64/float16 which are cast), got {_describe(arr)}"
        )
    if arr.ndim != 3 or arr.shape[2] != spec.n_features:
        raise InputError(
            f"source: expected shape (batch, source_len, {spec.n_features}), got {_describe(arr)}"
            + ("; add a batch axis with source[None]" if arr.ndim == 2 else "")
        )
    if arr.shape[1] < 1:
        raise InputError(f"source: expected source_len >= 1, got {_describe(arr)}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        item = int(np.argwhere(~finite)[0][0])
        raise InputError(f"source: expected finite values, got NaN or Inf (first in batch item {item})")
    return arr


def check_target_len(target_len: Any, spec: ModelSpec) -> int:
    """Return the number of points to decode: the spec's default, or a sane positive int."""
    if target_len is None:
        return spec.target_len
    if isinstance(target_len, bool) or not isinstance(target_len, numbers.Integral):
        raise InputError(f"target_len: expected an int in [1, {MAX_TARGET_LEN}], got {target_len!r}")
    if not 1 <= int(target_len) <= MAX_TARGET_LEN:
        raise InputError(f"target_len: expected an int in [1, {MAX_TARGET_LEN}], got {int(target_len)}")
    return int(target_len)


def check_mask(source_mask: Any, source: np.ndarray) -> np.ndarray:
    """Return a bool (N, 1, L) mask: all True when None; (N, L) is accepted too."""
    n, length = source.shape[:2]
    if source_mask is None:
        return np.ones((n, 1, length), dtype=bool)
    mask = np.asarray(source_mask)
    if mask.dtype != bool and mask.dtype.kind not in "iu":
        raise InputError(f"source_mask: expected bool or 0/1 integers, got {_describe(mask)}")
    if mask.shape == (n, length):
        mask = mask[:, None, :]  # (N, 1, L)
    if mask.shape != (n, 1, length):
        raise InputError(f"source_mask: expected shape ({n}, 1, {length}) to match source, got {_describe(mask)}")
    if mask.dtype != bool:
        if not np.isin(mask, (0, 1)).all():
            raise InputError("source_mask: expected only 0 and 1 values, got others")
        mask = mask.astype(bool)
    empty = ~mask.any(axis=-1).ravel()
    if n and empty.any():
        raise InputError(f"source_mask: every item needs at least one valid position; item {int(np.argmax(empty))} has none")
    return np.ascontiguousarray(mask)
