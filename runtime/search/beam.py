"""Beam search over batch x beam rows flattened into one batch axis; finished inputs leave the batch.

Live beams are ranked by summed log-prob. A finished hypothesis is ranked by CTranslate2's normalised score

    score = log_prob / length ** length_penalty

where `length` counts the decoding steps taken: the generated tokens plus the eos when there is one
(so it is never 0). Each step keeps the best 2 * beam_size candidates of each input: an eos among the first
beam_size of them becomes a finished hypothesis (as in fairseq and Hugging Face), the best beam_size others stay
live. At max_decoding_length the live beams are finished as they are, without an eos.

Stopping rule: an input is done when it holds num_hypotheses finished hypotheses and no live beam can still beat
the worst of them, or at max_decoding_length. Log-probs are <= 0, so a live beam with sum S after n tokens can at
best score max(S / (n + 1) ** length_penalty, S / max_decoding_length ** length_penalty) (the score is monotone
in length): stopping never loses a hypothesis this beam search would still have found. With length_penalty = 0
an input stops as soon as its best live beam falls behind, so beam_size=1 is greedy search; with
length_penalty > 0 the bound is looser and inputs tend to run longer.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from runtime.errors import InputError

from .step import (
    BatchAxes,
    Hypothesis,
    State,
    StepFn,
    call_step,
    check_decoding,
    check_float,
    check_int,
    forbid_eos,
    select,
)

MAX_LENGTH_PENALTY = 50  # lengths up to 10,000 (MAX_TARGET_LEN) ** +-50 stay finite in float64


def _normed(total: float, length: int, length_penalty: float) -> float:
    """total / length ** length_penalty in float64, saturating where a large |length_penalty| overflows (Python's
    float power would raise OverflowError instead)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return float(np.float64(total) / np.float64(length) ** length_penalty)


def _best_bound(live: np.ndarray, n: int, max_len: int, length_penalty: float) -> float:
    """The best score any continuation of live beams with sums `live` after `n` tokens could reach."""
    if n >= max_len or not np.isfinite(live).any():
        return -np.inf
    best = live.max()
    return max(_normed(best, n + 1, length_penalty), _normed(best, max_len, length_penalty))


def _candidates(live: np.ndarray, log_probs: np.ndarray, n: int, k: int) -> tuple[np.ndarray, ...]:
    """Each input's best min(2k, kV) extensions, best first (ties: lower beam, then lower token): sum, beam, token."""
    vocab = log_probs.shape[1]
    cand = (live[:, None] + log_probs).reshape(n, k * vocab)  # (n, k * V), float64
    m = min(2 * k, k * vocab)
    top = np.argpartition(-cand, m - 1, axis=1)[:, :m] if m < k * vocab else np.tile(np.arange(m), (n, 1))
    top = np.sort(top, axis=1)  # so that the stable sort below breaks ties by flat index, as argmax does
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(cand, top, 1), 1, kind="stable"), 1)  # (n, m)
    return np.take_along_axis(cand, top, 1), top // vocab, top % vocab  # (n, m) each


def _finish(history: np.ndarray, attention: np.ndarray | None, step_attention: np.ndarray | None, length: int,
            length_penalty: float, parent: int, total: float, token: int | None) -> Hypothesis:
    """Row `parent`'s path as a hypothesis: ended by eos (token None; eos is not output) or by max length."""
    tokens = history[parent].tolist() + ([] if token is None else [token])
    att = None if attention is None else attention[parent]  # (t, ..., Ls)
    if att is not None and token is not None:
        att = np.concatenate([att, step_attention[parent][None]])  # (t + 1, ..., Ls)
    return Hypothesis(tokens, _normed(total, length, length_penalty), float(total), att)


def _collect(found: list[Hypothesis], new: list[Hypothesis], live: np.ndarray, n_tokens: int, max_len: int,
             num_hypotheses: int, length_penalty: float) -> tuple[list[Hypothesis], bool]:
    """An input's n-best with `new` added, and whether it is done: full, and no live beam can beat the worst."""
    found = sorted(found + new, key=lambda h: -h.score)[:num_hypotheses]
    full = len(found) == num_hypotheses
    return found, full and _best_bound(live, n_tokens, max_len, length_penalty) <= found[-1].score


def _extend(sums: np.ndarray, beams: np.ndarray, tokens: np.ndarray, eos_id: int,
            k: int) -> tuple[np.ndarray, ...]:
    """The k best non-eos candidates of each input: parent beam, token, sum, each (n, k); eos fillers are dead."""
    pick = np.argsort(tokens == eos_id, axis=1, kind="stable")[:, :k]  # (n, k): non-eos first, rank order kept
    beam, token, total = (np.take_along_axis(a, pick, 1) for a in (beams, tokens, sums))
    return beam, token, np.where(token == eos_id, -np.inf, total)


def beam_search(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
                beam_size: int = 2, num_hypotheses: int = 1, length_penalty: float = 1.0,
                max_decoding_length: int = 256, min_decoding_length: int = 0,
                return_attention: bool = False) -> list[list[Hypothesis]]:
    """Up to num_hypotheses hypotheses per input, best score first (see the module docstring for the rules)."""
    check_decoding(state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length, min_decoding_length)
    k = check_int("beam_size", beam_size, 1)
    check_int("num_hypotheses", num_hypotheses, 1, k)
    length_penalty = check_float("length_penalty", length_penalty)
    if abs(length_penalty) > MAX_LENGTH_PENALTY:
        raise InputError(f"length_penalty must be from -{MAX_LENGTH_PENALTY} to {MAX_LENGTH_PENALTY}, got "
                         f"{length_penalty:g}; scores divide by length ** length_penalty, which leaves float64 "
                         "beyond that (usual values: 0 to 2)")
    kept: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    inputs = np.arange(batch_size)  # the input each live block of k rows decodes
    state = select(state, np.repeat(inputs, k), batch_axes)  # rows (B * k,): input b owns rows b*k .. b*k+k-1
    tokens = np.full(batch_size * k, bos_id, dtype=np.int64)  # (B * k,)
    history = np.zeros((batch_size * k, 0), dtype=np.int64)  # (B * k, t)
    # Only the first beam of each input is live at step 0, so the beam does not fill with k copies of one path.
    live = np.tile(np.r_[0.0, np.full(k - 1, -np.inf)], batch_size)  # (B * k,)
    attention: np.ndarray | None = None  # (B * k, t, ..., Ls)
    for t in range(max_decoding_length):
        result = call_step(step, tokens, state, batch_axes, eos_id, return_attention)
        log_probs = forbid_eos(result.log_probs, eos_id, t, min_decoding_length)
        n = len(inputs)
        top_sum, beam_of, token_of = _candidates(live, log_probs, n, k)  # (n, m) each
        is_eos = token_of == eos_id
        next_beam, next_token, next_live = _extend(top_sum, beam_of, token_of, eos_id, k)  # (n, k) each
        rows = (np.arange(n)[:, None] * k + next_beam).reshape(-1)  # (n * k,) flat parent row of each new beam
        step_attention = result.attention if return_attention else None  # (n * k, ..., Ls)
        if step_attention is not None and attention is None:
            attention = np.zeros((n * k, 0) + step_attention.shape[1:], step_attention.dtype)  # (n * k, 0, ..., Ls)
        end = partial(_finish, history, attention, step_attention, t + 1, length_penalty)
        done = np.zeros(n, dtype=bool)
        for i in range(n):
            new = [end(i * k + beam_of[i, r], top_sum[i, r], None)
                   for r in np.flatnonzero(is_eos[i, :k] & np.isfinite(top_sum[i, :k]))]
            if t + 1 == max_decoding_length:  # live beams end here as they are
                new += [end(i * k + next_beam[i, j], next_live[i, j], int(next_token[i, j]))
                        for j in np.flatnonzero(np.isfinite(next_live[i]))]
            kept[inputs[i]], done[i] = _collect(kept[inputs[i]], new, next_live[i], t + 1, max_decoding_length,
                                                num_hypotheses, length_penalty)
        if done.all() or t + 1 == max_decoding_length:
            break
        keep = np.flatnonzero(~done)  # reorder and drop finished inputs with one select
        rows = rows.reshape(n, k)[keep].reshape(-1)  # (n_keep * k,)
        state = select(result.state, rows, batch_axes)
        history = np.concatenate([history[rows], next_token[keep].reshape(-1, 1)], axis=1)  # (n_keep * k, t + 1)
        if step_attention is not None:
            attention = np.concatenate([attention[rows], step_attention[rows][:, None]], axis=1)
        tokens, live, inputs = next_token[keep].reshape(-1), next_live[keep].reshape(-1), inputs[keep]
    return kept
