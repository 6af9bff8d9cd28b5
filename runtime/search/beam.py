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

Speed, not semantics: entries named `constant` (what a step never changes: encoder memory, keys, masks) are
expanded to the k beams once and selected again only when inputs finish, in whole blocks of k rows; the rest of the
state is reordered by parent beam every step. With `per_input`, the step reads the constant entries once per input
(a beam step graph, whose rows attend to their input's one copy together): they are never expanded, and are
selected by input when inputs finish. Finished hypotheses and the stopping rule are arrays over inputs
(runtime.search.nbest), and token paths and attention are parent pointers read back once at the end
(runtime.search.trace), so a step costs a fixed handful of numpy calls whatever the batch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from runtime.errors import InputError, int_text

from .nbest import NBest, normed
from .step import (
    BatchAxes,
    Hypothesis,
    State,
    StepFn,
    call_step,
    check_constant,
    check_decoding,
    check_float,
    check_int,
    forbid_eos,
    on_host,
    select,
)
from .trace import Trace

MAX_BEAM = 256  # translate_batch's and the CLI's limit: wider beams only exhaust memory (100,000: 5-8 GB, one text)
MAX_LENGTH_PENALTY = 50  # lengths up to 10,000 (MAX_TARGET_LEN) ** +-50 stay finite in float64


def _candidates(live: np.ndarray, log_probs: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Each input's best min(2k, kV) extensions, best first (ties: lower beam, then lower token): sum, beam, token.
    `rows` is arange(n)[:, None]; the best m are picked by argpartition, so boundary ties fall as they always did."""
    n, vocab = len(rows), log_probs.shape[1]
    cand = (live[:, None] + log_probs).reshape(n, k * vocab)  # (n, k * V), float64
    m = min(2 * k, k * vocab)
    neg = -cand
    top = neg.argpartition(m - 1, axis=1)[:, :m] if m < k * vocab else np.broadcast_to(np.arange(m), (n, m))
    top = top[rows, np.lexsort((top, neg[rows, top]))]  # (n, m): descending sum, ties by flat index, as argmax
    return (cand[rows, top], *np.divmod(top, vocab))


def _extend(sums: np.ndarray, beams: np.ndarray, tokens: np.ndarray, is_eos: np.ndarray, rows: np.ndarray,
            k: int) -> tuple[np.ndarray, ...]:
    """The k best non-eos candidates of each input: parent beam, token, sum, each (n, k); eos fillers are dead."""
    if not np.count_nonzero(is_eos[:, :k]):  # the common case: the k best are all non-eos
        return beams[:, :k], tokens[:, :k], sums[:, :k]
    pick = np.argsort(is_eos, axis=1, kind="stable")[:, :k]  # (n, k): non-eos first, rank order kept
    beam, token, total = beams[rows, pick], tokens[rows, pick], sums[rows, pick]
    return beam, token, np.where(is_eos[rows, pick], -np.inf, total)


def _record_ends(found: NBest, inputs: np.ndarray, rows: np.ndarray, t: int, last: bool, length_penalty: float,
                 ranked: tuple[np.ndarray, ...], kept: tuple[np.ndarray, ...], is_eos: np.ndarray) -> None:
    """Add step t's finished hypotheses: an eos among an input's first k candidates (ranked: sums, beams, tokens
    (n, m)), then, at max length, every live beam as it is (kept: beams, tokens, sums (n, k)). Input i owns rows
    i*k .. i*k + k - 1. Two merges keep the same n-best as one over both: each is a stable sort, then a cut."""
    k = kept[0].shape[1]
    if np.count_nonzero(is_eos[:, :k]):
        sums, beams = ranked[0][:, :k], ranked[1][:, :k]  # (n, k) each
        found.add(inputs, is_eos[:, :k] & np.isfinite(sums), normed(sums, t + 1, length_penalty), sums, t,
                  rows * k + beams, -1)
    if last:
        beam, token, total = kept
        found.add(inputs, np.isfinite(total), normed(total, t + 1, length_penalty), total, t, rows * k + beam, token)


def check_beam(beam_size: int, num_hypotheses: int, length_penalty: float) -> tuple[int, float]:
    """beam_size, length_penalty checked; num_hypotheses must be in [1, beam_size]."""
    k = check_int("beam_size", beam_size, 1)
    n = check_int("num_hypotheses", num_hypotheses, 1)
    if n > k:
        fix = f"pass beam_size >= {n}, or fewer hypotheses" if n <= MAX_BEAM else \
            f"pass at most {k}, or a wider beam (beam_size is at most {MAX_BEAM})"
        raise InputError(f"num_hypotheses must be at most beam_size ({k}), got {int_text(n)}; {fix}")
    length_penalty = check_float("length_penalty", length_penalty)
    if abs(length_penalty) > MAX_LENGTH_PENALTY:
        raise InputError(f"length_penalty must be from -{MAX_LENGTH_PENALTY} to {MAX_LENGTH_PENALTY}, got "
                         f"{length_penalty:g}; scores divide by length ** length_penalty, which leaves float64 "
                         "beyond that (usual values: 0 to 2)")
    return k, length_penalty


EXPAND_BYTES = 16 << 20  # with `between`, an entry is expanded in pieces of about this size, `between` before each


def _expanded(state: State, rows: np.ndarray, batch_axes: BatchAxes, kept: frozenset[str],
              between: Callable[[], None] | None) -> State:
    """`rows` of every entry but `kept`. With long sources and wide beams an entry (cross keys, memory) can be
    hundreds of MB, written into fresh memory at a few hundred MB/s: with `between`, piece by piece, so that a
    cancel is asked every few tens of milliseconds ahead of the first step, not after seconds."""
    out = {}
    for name in (n for n in state if n not in kept):
        axis, source = batch_axes[name], on_host(state[name])
        row_bytes = source.nbytes // max(1, source.shape[axis])
        piece = len(rows) if between is None else max(1, EXPAND_BYTES // max(1, row_bytes))
        if piece >= len(rows):  # one take: the whole entry at once
            if between is not None:
                between()
            out[name] = source.take(rows, axis=axis)
            continue
        out[name] = whole = np.empty(source.shape[:axis] + (len(rows),) + source.shape[axis + 1:], source.dtype)
        for start in range(0, len(rows), piece):
            between()
            at = (slice(None),) * axis + (slice(start, start + piece),)  # rows start .. start + piece on the axis
            whole[at] = source.take(rows[start:start + piece], axis=axis)
    return out


def beam_search(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
                beam_size: int = 2, num_hypotheses: int = 1, length_penalty: float = 1.0,
                max_decoding_length: int = 256, min_decoding_length: int = 0, return_attention: bool = False,
                constant: frozenset[str] = frozenset(), per_input: bool = False,
                between: Callable[[], None] | None = None) -> list[list[Hypothesis]]:
    """Up to num_hypotheses hypotheses per input, best score first (see the module docstring for the rules);
    `constant` names the state entries the step never changes; `per_input`: the step reads those once per input.
    `between` is called before each piece of a state entry expanded to k rows per input, ahead of the first step
    (it may raise to stop: a caller's cancel, which the step itself asks from then on)."""
    check_decoding(state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length, min_decoding_length)
    k, length_penalty = check_beam(beam_size, num_hypotheses, length_penalty)
    constant = check_constant(constant, state)
    if not isinstance(per_input, bool):
        raise InputError(f"per_input: expected True or False, got {per_input!r}")
    found, trace = NBest(batch_size, num_hypotheses), Trace()
    inputs = np.arange(batch_size)  # the input each live block of k rows decodes
    state = {**state, **_expanded(state, np.repeat(inputs, k), batch_axes, constant if per_input else frozenset(),
                                  between)}  # rows (B * k,): input b owns rows b*k .. b*k+k-1
    fixed = {name: state[name] for name in constant}  # expanded once; selected again only when inputs finish
    tokens = np.full(batch_size * k, bos_id, dtype=np.int64)  # (B * k,)
    # Only the first beam of each input is live at step 0, so the beam does not fill with k copies of one path.
    live = np.full((batch_size, k), -np.inf)  # (B, k)
    live[:, 0] = 0.0
    live = live.reshape(-1)  # (B * k,)
    rows = np.arange(batch_size)[:, None]  # (n, 1): the live inputs' positions
    first = rows * k  # (n, 1): input i owns rows i*k .. i*k + k - 1
    for t in range(max_decoding_length):
        result = call_step(step, tokens, state, batch_axes, eos_id, return_attention)
        log_probs = forbid_eos(result.log_probs, eos_id, t, min_decoding_length)
        ranked = _candidates(live, log_probs, rows, k)  # sums, beams, tokens: (n, m) each
        is_eos = ranked[2] == eos_id  # (n, m)
        kept = _extend(*ranked, is_eos, rows, k)  # beams, tokens, sums: (n, k) each
        if return_attention:
            trace.attend(result.attention)
        last = t + 1 == max_decoding_length
        _record_ends(found, inputs, rows, t, last, length_penalty, ranked, kept, is_eos)
        if last:
            break
        parents, next_tokens, next_live = first + kept[0], kept[1], kept[2]  # (n, k) each
        done = found.done(inputs, next_live, t + 1, max_decoding_length, length_penalty)  # None: none can be
        if done is not None and np.count_nonzero(done):  # drop finished inputs: their k rows leave every array
            if done.all():
                break
            keep = np.flatnonzero(~done)
            parents, next_tokens, next_live, inputs = parents[keep], next_tokens[keep], next_live[keep], inputs[keep]
            rows = np.arange(len(keep))[:, None]  # (n_keep, 1)
            first = rows * k  # (n_keep, 1)
            fixed = select(fixed, keep if per_input else (keep[:, None] * k + np.arange(k)).reshape(-1),
                           batch_axes)  # (n_keep[ * k],)
        parents, tokens, live = parents.reshape(-1), next_tokens.reshape(-1), next_live.reshape(-1)  # (n * k,)
        moving = {name: value for name, value in result.state.items() if name not in constant}
        state = {**select(moving, parents, batch_axes), **fixed}
        trace.push(parents, tokens)
    return found.hypotheses(trace)
