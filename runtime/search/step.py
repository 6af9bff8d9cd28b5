"""The step interface every decoding strategy drives, and the one way decoder state is reordered.

A step function feeds one token per batch row and returns the next-token log-probs:

    step(tokens: (B,) int64, state: {name: array}) -> StepResult(log_probs (B, V), state, attention (B, ..., Ls) | None)

`state` holds everything per-row the decoder needs (recurrent hidden/cell, encoder memory, source mask, caches);
`batch_axes[name]` says which axis of `state[name]` is the batch axis. Strategies never look inside the state:
they reorder (beam) or shrink (finished rows) it with `select` only, so they work for any model.

`constant` names the entries a step reads but never changes (encoder memory, keys, source mask, cross-attention
keys/values): the strategies hold them themselves and feed them to every step, so a step may return only what it
changes. Beam search expands them once per beam and selects them again only when inputs finish, instead of
reordering them with the rest of the state at every step.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from runtime.errors import InputError, brief, int_text

State = dict[str, np.ndarray]
BatchAxes = dict[str, int]


@dataclass(frozen=True)
class StepResult:
    """One decoder step: log-probs (B, V), the next state, and attention (B, ..., Ls) or None."""

    log_probs: np.ndarray
    state: State
    attention: np.ndarray | None = None


StepFn = Callable[[np.ndarray, State], StepResult]


@dataclass
class Hypothesis:
    """A decoded sequence: tokens without bos/eos, its ranking score, summed log-prob, attention (len, ..., Ls)."""

    tokens: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None = None


def select(state: State, index: np.ndarray, batch_axes: BatchAxes) -> State:
    """Rows `index` of every state entry, taken along its batch axis (beam reorder, dropping finished rows).
    An entry on an accelerator (an onnxruntime OrtValue kept there by IO binding) is copied to the host first:
    its `numpy()`; the next step moves it back."""
    return {name: on_host(value).take(index, axis=batch_axes[name]) for name, value in state.items()}


def on_host(value: Any) -> np.ndarray:
    """A state entry as a numpy array: an OrtValue that IO binding kept on an accelerator is copied here."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def check_constant(constant: object, state: State) -> frozenset[str]:
    """`constant` as a frozenset of names of `state`'s entries, else an InputError naming what is wrong."""
    if not isinstance(constant, (set, frozenset)) or not all(isinstance(name, str) for name in constant):
        raise InputError(f"constant must be a set of state entry names, got {brief(constant)}")
    unknown = sorted(constant - state.keys())
    if unknown:
        raise InputError(f"constant names {unknown}, which the state does not hold; state entries: {sorted(state)}")
    return frozenset(constant)


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high], else an InputError naming `name`."""
    ok = type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))  # ABC: slow
    if not ok or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InputError(f"{name} must be an int {bound}, got {brief(value)}")
    return int(value)


def check_min_length(min_decoding_length: object, max_decoding_length: int, limit: int | None = None) -> int:
    """min_decoding_length as an int in [0, max_decoding_length]; above that bound, the message names it. `limit`:
    max_decoding_length was not given but is the model's default, which may be raised up to `limit`."""
    n = check_int("min_decoding_length", min_decoding_length, 0)
    if n > max_decoding_length:
        if limit is not None:
            more = f"pass max_decoding_length >= {n} too (at most {limit}), or " if n <= limit else ""
            raise InputError(f"min_decoding_length {int_text(n)} is more than max_decoding_length, which was not "
                             f"given: its default is {max_decoding_length} (the model's target_len); {more}pass a "
                             f"min_decoding_length of at most {max_decoding_length}")
        raise InputError(f"min_decoding_length {int_text(n)} is more than max_decoding_length "
                         f"{max_decoding_length} (the decode's bound); pass at most {max_decoding_length}")
    return n


def is_finite_real(value: object) -> bool:
    """Whether `value` is a real number (never a bool) that float64 holds finitely."""
    try:
        return (type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, bool))) and \
            math.isfinite(value)
    except OverflowError:  # an int beyond float64
        return False


def check_float(name: str, value: object) -> float:
    """`value` as a finite float, else an InputError naming `name`."""
    if not is_finite_real(value):
        raise InputError(f"{name} must be a finite float, got {brief(value)}")
    return float(value)


def check_decoding(state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
                   max_decoding_length: int, min_decoding_length: int) -> None:
    """Validate the arguments every strategy shares; the state must have `batch_size` rows on each batch axis."""
    check_int("batch_size", batch_size, 1)
    check_int("bos_id", bos_id, 0)
    check_int("eos_id", eos_id, 0)
    check_int("max_decoding_length", max_decoding_length, 1)
    check_min_length(min_decoding_length, max_decoding_length)
    for name, value in state.items():
        if name not in batch_axes:
            raise InputError(f"state[{name!r}] has no entry in batch_axes; declare its batch axis")
        axis, shape = batch_axes[name], _shape(value)
        if shape is None or not -len(shape) <= axis < len(shape):
            raise InputError(f"state[{name!r}] must be an array with batch axis {axis}, got {brief(value)}")
        if shape[axis] != batch_size:
            raise InputError(f"state[{name!r}] must have batch_size={batch_size} rows on axis {axis}, "
                             f"got shape {shape}")


def _shape(value: object) -> tuple[int, ...] | None:
    """A numpy array's shape, or an onnxruntime OrtValue's (a state entry kept on the device); None otherwise."""
    if isinstance(value, np.ndarray):
        return value.shape
    shape = getattr(value, "shape", None) if type(value).__name__ == "OrtValue" else None
    return tuple(shape()) if callable(shape) else None


def call_step(step: StepFn, tokens: np.ndarray, state: State, batch_axes: BatchAxes, eos_id: int,
              need_attention: bool) -> StepResult:
    """Run one step and check what it returned, so a model adapter's mistake fails here, by name."""
    result = step(tokens, state)
    log_probs, rows = result.log_probs, len(tokens)
    if log_probs.ndim != 2 or log_probs.shape[0] != rows or log_probs.shape[1] <= eos_id:
        raise InputError(f"step must return log_probs of shape ({rows}, V) with V > eos_id={eos_id}, "
                         f"got shape {log_probs.shape}")
    if not result.state.keys() <= batch_axes.keys():  # a subset test: cheap on the path taken every step
        unknown = sorted(result.state.keys() - batch_axes.keys())
        raise InputError(f"step returned state {unknown} with no entry in batch_axes; declare their batch axes")
    if need_attention and (result.attention is None or result.attention.shape[0] != rows):
        shape = None if result.attention is None else result.attention.shape
        raise InputError(f"return_attention=True needs step attention of shape ({rows}, ..., Ls), got {shape}")
    return result


def forbid_eos(log_probs: np.ndarray, eos_id: int, step_index: int, min_decoding_length: int) -> np.ndarray:
    """Log-probs with eos at -inf while fewer than `min_decoding_length` tokens are generated (copy, not in place)."""
    if step_index >= min_decoding_length:
        return log_probs
    out = log_probs.copy()  # the step's own output may be reused by the caller
    out[:, eos_id] = -np.inf
    return out
