"""Greedy search: at every step each row takes its most likely token; finished rows leave the batch."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .step import (
    BatchAxes,
    Hypothesis,
    State,
    StepFn,
    call_step,
    check_decoding,
    forbid_eos,
    select,
)

# A token picker maps the step's (B, V) log-probs to the (B,) chosen token ids.
Picker = Callable[[np.ndarray], np.ndarray]


def rollout(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
            max_decoding_length: int, min_decoding_length: int, return_attention: bool,
            pick: Picker) -> list[Hypothesis]:
    """Decode one path per input with `pick` choosing each next token; score = summed model log-prob."""
    check_decoding(state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length, min_decoding_length)
    out: list[Hypothesis | None] = [None] * batch_size
    inputs = np.arange(batch_size)  # the input each live row decodes
    tokens = np.full(batch_size, bos_id, dtype=np.int64)  # (B,)
    history = np.zeros((batch_size, 0), dtype=np.int64)  # (B, t)
    log_prob = np.zeros(batch_size)  # (B,) float64, so long sums do not drift
    attention: np.ndarray | None = None  # (B, t, ..., Ls)
    for t in range(max_decoding_length):
        result = call_step(step, tokens, state, batch_axes, eos_id, return_attention)
        log_probs = forbid_eos(result.log_probs, eos_id, t, min_decoding_length)
        tokens = np.asarray(pick(log_probs), dtype=np.int64)  # (B,)
        log_prob = log_prob + log_probs[np.arange(len(tokens)), tokens]
        ended = (tokens == eos_id) | (t + 1 == max_decoding_length)
        history = np.concatenate([history, tokens[:, None]], axis=1)  # (B, t + 1)
        if return_attention:
            step_attention = result.attention[:, None]  # (B, 1, ..., Ls)
            attention = step_attention if attention is None else np.concatenate([attention, step_attention], 1)
        for row in np.flatnonzero(ended):
            n = t if tokens[row] == eos_id else t + 1  # eos is not part of the output
            out[inputs[row]] = Hypothesis(tokens=history[row, :n].tolist(), score=float(log_prob[row]),
                                          log_prob=float(log_prob[row]),
                                          attention=None if attention is None else attention[row, :n])
        if ended.all():
            break
        if ended.any():  # shrink every per-row array the same way, so the rest run on fewer rows
            keep = np.flatnonzero(~ended)
            state, tokens, inputs = select(result.state, keep, batch_axes), tokens[keep], inputs[keep]
            history, log_prob = history[keep], log_prob[keep]
            attention = None if attention is None else attention[keep]
        else:
            state = result.state
    return out  # type: ignore[return-value]  # every input ends by max_decoding_length


def greedy_search(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
                  max_decoding_length: int, min_decoding_length: int = 0,
                  return_attention: bool = False) -> list[Hypothesis]:
    """The argmax path of each input (ties: lowest token id), one Hypothesis per input, in input order."""
    return rollout(step, state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length,
                   min_decoding_length, return_attention, lambda log_probs: np.argmax(log_probs, axis=1))
