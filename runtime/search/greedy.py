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
    check_constant,
    check_decoding,
    forbid_eos,
    select,
)

# A token picker maps the step's (B, V) log-probs to the (B,) chosen token ids.
Picker = Callable[[np.ndarray], np.ndarray]


class Columns:
    """Each step's tokens and attention, kept per run of steps over the same rows and laid out once at the end,
    instead of every row's history being copied at every step."""

    def __init__(self, batch_size: int, keep_attention: bool) -> None:
        self.batch_size, self.keep_attention = batch_size, keep_attention
        self.runs: list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]] = []

    def start(self, inputs: np.ndarray) -> None:
        """The following steps decode rows `inputs` (n,)."""
        self.runs.append((inputs, [], []))

    def add(self, tokens: np.ndarray, attention: np.ndarray | None) -> None:
        """One step's tokens (n,) and attention (n, ..., Ls); the attention is copied (a step may reuse it)."""
        self.runs[-1][1].append(tokens)
        if self.keep_attention:
            self.runs[-1][2].append(np.array(attention))

    def layout(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Ids (B, T) and attention (B, T, ..., Ls) or None; a row's entries past its end are left 0."""
        width = sum(len(tokens) for _, tokens, _ in self.runs)
        ids = np.zeros((self.batch_size, width), np.int64)  # (B, T)
        first = self.runs[0][2][0] if self.keep_attention else None
        att = None if first is None else np.zeros((self.batch_size, width) + first.shape[1:], first.dtype)
        s = 0
        for inputs, tokens, attention in self.runs:
            ids[inputs, s:s + len(tokens)] = np.stack(tokens, axis=1)  # (n, steps)
            if att is not None:
                att[inputs, s:s + len(tokens)] = np.stack(attention, axis=1)  # (n, steps, ..., Ls)
            s += len(tokens)
        return ids, att


def rollout(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
            max_decoding_length: int, min_decoding_length: int, return_attention: bool,
            pick: Picker, constant: frozenset[str] = frozenset()) -> list[Hypothesis]:
    """Decode one path per input with `pick` choosing each next token; score = summed model log-prob."""
    check_decoding(state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length, min_decoding_length)
    constant = check_constant(constant, state)
    fixed = {name: state[name] for name in constant}  # fed to every step; shrunk only when rows finish
    inputs = np.arange(batch_size)  # the input each live row decodes
    tokens = np.full(batch_size, bos_id, dtype=np.int64)  # (B,)
    log_prob = np.zeros(batch_size)  # (B,) float64, so long sums do not drift
    lengths, totals = np.zeros(batch_size, np.int64), np.zeros(batch_size)  # (B,) each, set as inputs end
    columns = Columns(batch_size, return_attention)
    columns.start(inputs)
    for t in range(max_decoding_length):
        result = call_step(step, tokens, state, batch_axes, eos_id, return_attention)
        log_probs = forbid_eos(result.log_probs, eos_id, t, min_decoding_length)
        tokens = np.asarray(pick(log_probs), dtype=np.int64)  # (B,)
        log_prob = log_prob + log_probs[np.arange(len(tokens)), tokens]
        columns.add(tokens, result.attention)
        ended = (tokens == eos_id) | (t + 1 == max_decoding_length)
        state = {**result.state, **fixed} if fixed else result.state
        if not ended.any():
            continue
        done = inputs[ended]
        lengths[done], totals[done] = t + (tokens[ended] != eos_id), log_prob[ended]  # eos is not output
        if ended.all():
            break
        keep = np.flatnonzero(~ended)  # shrink every per-row array the same way, so the rest run on fewer rows
        state, tokens, inputs, log_prob = select(state, keep, batch_axes), tokens[keep], inputs[keep], log_prob[keep]
        fixed = {name: state[name] for name in constant}
        columns.start(inputs)
    ids, attention = columns.layout()
    return [Hypothesis(ids[b, :n].tolist(), total, total, None if attention is None else attention[b, :n])
            for b, (n, total) in enumerate(zip(lengths.tolist(), totals.tolist()))]


def greedy_search(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
                  max_decoding_length: int, min_decoding_length: int = 0, return_attention: bool = False,
                  constant: frozenset[str] = frozenset()) -> list[Hypothesis]:
    """The argmax path of each input (ties: lowest token id), one Hypothesis per input, in input order."""
    return rollout(step, state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length,
                   min_decoding_length, return_attention, lambda log_probs: np.argmax(log_probs, axis=1), constant)
