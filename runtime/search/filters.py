"""Sampling filters on (B, V) logits or log-probs, each a pure function; `filter_logits` applies them in order.

Order: temperature -> top-k -> top-p (Hugging Face's logits warpers, CTranslate2's sampling options).
A filtered-out token gets -inf, so softmax gives it probability 0. Ties are broken toward the lower token id,
as `np.argmax` does, so top-k=1 and a tiny top-p pick exactly the greedy token.
"""
from __future__ import annotations

import numbers
import sys

import numpy as np

from runtime.errors import InputError, brief

from .step import check_int, is_finite_real

SMALLEST = sys.float_info.min  # 2.2e-308: below it a float is subnormal, which a decode that flushes denormals
# (runtime.denormals) reads as 0, so an option that small would pass or fail by the batch's size


def _subnormal(name: str, value: float) -> None:
    if value < SMALLEST:
        raise InputError(f"{name} must be at least {SMALLEST:.4g} (a smaller float reads as 0 while decoding), got "
                         f"{brief(value)}")


def check_temperature(name: str, value: object) -> float:
    """`value` as a finite float > 0 (a normal one), else an InputError naming `name`."""
    if not (is_finite_real(value) and value > 0):
        raise InputError(f"{name} must be a finite float > 0, got {brief(value)}")
    _subnormal(name, value)  # type: ignore[arg-type]
    return float(value)


def check_topp(name: str, value: object) -> float:
    """`value` as a float in (0, 1] (a normal one), else an InputError naming `name`."""
    ok = (type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, bool))) and 0 < value <= 1
    if not ok:
        raise InputError(f"{name} must be a float in (0, 1], got {brief(value)}")
    _subnormal(name, value)  # type: ignore[arg-type]
    return float(value)


def _descending(logits: np.ndarray) -> np.ndarray:
    """Per-row token order, best first, ties by lower id."""
    return np.argsort(-logits, axis=1, kind="stable")  # (B, V)


def _keep(logits: np.ndarray, order: np.ndarray, kept_ranks: np.ndarray) -> np.ndarray:
    """`logits` with -inf wherever the token's rank in `order` is not kept; kept_ranks (B, V) bool by rank."""
    mask = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(mask, order, kept_ranks, axis=1)  # rank-indexed -> token-indexed
    return np.where(mask, logits, -np.inf)


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Logits divided by `temperature` (> 1 flattens, < 1 sharpens), each row shifted first so that its best is 0:
    no softmax changes, and a tiny temperature cannot overflow every column of a row to -inf (its best stays 0)."""
    temperature = check_temperature("temperature", temperature)
    best = logits.max(axis=1, keepdims=True)  # (B, 1)
    with np.errstate(over="ignore"):  # what overflows is -inf: probability 0, as it was
        return (logits - np.where(np.isfinite(best), best, 0.0)) / temperature


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the `k` highest tokens of each row (exactly k; ties by lower id), -inf elsewhere."""
    k = check_int("k", k, 1)
    if k >= logits.shape[1]:
        return logits
    order = _descending(logits)
    ranks = np.broadcast_to(np.arange(logits.shape[1]) < k, logits.shape)  # (B, V)
    return _keep(logits, order, ranks)


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest best-first set of tokens whose probability sums to >= p (at least one), -inf elsewhere."""
    p = check_topp("p", p)
    if p >= 1.0:
        return logits
    order = _descending(logits)
    ranked = np.take_along_axis(logits, order, axis=1).astype(np.float64)  # (B, V), best first
    probs = np.exp(ranked - ranked[:, :1])
    probs /= probs.sum(axis=1, keepdims=True)
    cumulative = np.cumsum(probs, axis=1)[:, :-1]  # (B, V - 1)
    mass_before = np.concatenate([np.zeros_like(probs[:, :1]), cumulative], axis=1)  # (B, V): of better ranks
    return _keep(logits, order, mass_before < p)  # rank 0 has mass_before 0 < p, so one token always stays


def filter_logits(logits: np.ndarray, temperature: float = 1.0, topk: int = 0, topp: float = 1.0) -> np.ndarray:
    """temperature -> top-k (0 = off) -> top-p (1.0 = off), argument names as `sample` takes them."""
    temperature = check_temperature("sampling_temperature", temperature)
    topk = check_int("sampling_topk", topk, 0)
    topp = check_topp("sampling_topp", topp)
    out = apply_temperature(logits, temperature) if temperature != 1.0 else logits
    if topk:
        out = top_k_filter(out, topk)
    return top_p_filter(out, topp)
