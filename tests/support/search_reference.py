"""The decoding strategies as they were before issue 22 (commit 8979b4b), frozen: the reference that
tests/test_search_speed.py compares the fast ones with, token for token and score for score, and that
benchmarks/search_bench.py times beside them. Validation helpers come from the runtime (they are not timed per
step); the per-step helpers (`select`, `call_step`, `forbid_eos`) are copied so later changes there do not move
this baseline."""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from runtime.errors import InputError
from runtime.search.filters import check_temperature, check_topp, filter_logits
from runtime.search.step import (
    BatchAxes,
    Hypothesis,
    State,
    StepFn,
    StepResult,
    check_decoding,
    check_float,
    check_int,
)


def select(state: State, index: np.ndarray, batch_axes: BatchAxes) -> State:
    """Rows `index` of every state entry, taken along its batch axis (beam reorder, dropping finished rows).
    An entry on an accelerator (an onnxruntime OrtValue kept there by IO binding) is copied to the host first:
    its `numpy()`; the next step moves it back."""
    return {name: np.take(value if isinstance(value, np.ndarray) else value.numpy(), index, axis=batch_axes[name])
            for name, value in state.items()}


def call_step(step: StepFn, tokens: np.ndarray, state: State, batch_axes: BatchAxes, eos_id: int,
              need_attention: bool) -> StepResult:
    """Run one step and check what it returned, so a model adapter's mistake fails here, by name."""
    result = step(tokens, state)
    log_probs, rows = result.log_probs, len(tokens)
    if log_probs.ndim != 2 or log_probs.shape[0] != rows or log_probs.shape[1] <= eos_id:
        raise InputError(f"step must return log_probs of shape ({rows}, V) with V > eos_id={eos_id}, "
                         f"got shape {log_probs.shape}")
    unknown = sorted(set(result.state) - set(batch_axes))
    if unknown:
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


def sample(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
           max_decoding_length: int, min_decoding_length: int = 0, sampling_temperature: float = 1.0,
           sampling_topk: int = 0, sampling_topp: float = 1.0, seed: int | None = None,
           return_attention: bool = False) -> list[Hypothesis]:
    """One sampled Hypothesis per input; the same call with the same `seed` gives the same output.

    Filters run temperature -> top-k (0 = off) -> top-p (1.0 = off) on the step's log-probs. Scores and log_probs
    are sums of the model's own log-probs of the drawn tokens, before any filter, so they compare with greedy's.
    """
    check_temperature("sampling_temperature", sampling_temperature)
    check_int("sampling_topk", sampling_topk, 0)
    check_topp("sampling_topp", sampling_topp)
    if seed is not None:
        check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)

    def pick(log_probs: np.ndarray) -> np.ndarray:
        logits = filter_logits(log_probs.astype(np.float64), sampling_temperature, sampling_topk, sampling_topp)
        # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits); -inf tokens are never drawn.
        return np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)  # (B,)

    return rollout(step, state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length,
                   min_decoding_length, return_attention, pick)
