"""Each input's best finished hypotheses as arrays over (inputs, ranks), so beam search keeps its n-best lists and
tests its stopping rule for every input at once, with no Python loop over inputs per step."""
from __future__ import annotations

import numpy as np

from .step import Hypothesis
from .trace import Trace

SCORE, LOG_PROB, STEP, ROW, TOKEN = range(5)  # a slot's fields; ids are exact in float64 (below 2 ** 53)


def normed(total: np.ndarray, length: int, length_penalty: float) -> np.ndarray:
    """total / length ** length_penalty in float64, elementwise, saturating where a large |length_penalty|
    overflows (Python's float power would raise OverflowError instead)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return total / np.float64(length) ** length_penalty


def best_bound(live: np.ndarray, n: int, max_len: int, length_penalty: float) -> np.ndarray:
    """Per input, the best score any continuation of its live beams (sums `live` (n_inputs, k) after `n` tokens)
    could reach; -inf where none is live or no step is left. Scores are monotone in length, so the best is at
    length n + 1 or at max_len."""
    if n >= max_len:
        return np.full(len(live), -np.inf)
    best = live.max(axis=1)  # (n_inputs,)
    bound = np.maximum(normed(best, n + 1, length_penalty), normed(best, max_len, length_penalty))
    return np.where(np.isfinite(live).any(axis=1), bound, -np.inf)


class NBest:
    """Per input, H slots (B, H, 5) of finished hypotheses, best score first: score, summed log-prob, and where
    the path ends in the Trace (step, row, last token or -1 when eos ended it); `count` (B,) says how many are
    filled."""

    def __init__(self, batch_size: int, num_hypotheses: int) -> None:
        self.slots = np.zeros((batch_size, num_hypotheses, 5))
        self.count = np.zeros(batch_size, np.int64)
        self.some_full = False  # whether any input has ever filled its H slots: until then none can be done

    def add(self, inputs: np.ndarray, valid: np.ndarray, score: np.ndarray, log_prob: np.ndarray, step: int,
            row: np.ndarray, token: np.ndarray | int) -> None:
        """Merge new hypotheses (n, c) of `inputs` (n,) where `valid`: the same n-best as a stable sort of the kept
        list followed by the new ones, in column order, by descending score (ties: the earlier first)."""
        n, h = len(inputs), self.slots.shape[1]
        new = np.empty(valid.shape + (5,))  # (n, c, 5)
        new[..., SCORE], new[..., LOG_PROB], new[..., STEP], new[..., ROW], new[..., TOKEN] = (
            score, log_prob, step, row, token)
        valid = np.concatenate([np.arange(h) < self.count[inputs][:, None], valid], axis=1)  # (n, H + c)
        merged = np.concatenate([self.slots[inputs], new], axis=1)  # (n, H + c, 5)
        key = np.where(valid, -merged[..., SCORE], np.nan)  # nan sorts last, keeping the valid ones in front
        order = np.argsort(key, axis=1, kind="stable")[:, :h]  # (n, H)
        self.slots[inputs] = merged[np.arange(n)[:, None], order]  # (n, H, 5)
        self.count[inputs] = np.minimum(valid.sum(axis=1), h)
        self.some_full = self.some_full or bool(np.count_nonzero(self.count[inputs] == h))

    def done(self, inputs: np.ndarray, live: np.ndarray, n: int, max_len: int,
             length_penalty: float) -> np.ndarray | None:
        """(n_inputs,): full, and no live beam (sums `live` (n_inputs, k) after `n` tokens) can beat the worst kept;
        None while no input has ever been full (none can be done)."""
        if not self.some_full:
            return None
        full = self.count[inputs] == self.slots.shape[1]
        return full & (best_bound(live, n, max_len, length_penalty) <= self.slots[inputs, -1, SCORE])

    def hypotheses(self, trace: Trace) -> list[list[Hypothesis]]:
        """Every input's kept hypotheses, best first, their tokens and attention read back from `trace`."""
        b, j = np.nonzero(np.arange(self.slots.shape[1]) < self.count[:, None])  # (P,) each, input-major
        kept = self.slots[b, j]  # (P, 5)
        ids, lengths, att = trace.paths(*kept[:, STEP:].astype(np.int64).T)
        out: list[list[Hypothesis]] = [[] for _ in range(len(self.count))]
        scores, log_probs = kept[:, SCORE].tolist(), kept[:, LOG_PROB].tolist()
        for p, (b_p, n) in enumerate(zip(b.tolist(), lengths.tolist())):
            attention = None if att is None else att[p, :n]  # (n, ..., Ls)
            out[b_p].append(Hypothesis(ids[p, :n].tolist(), scores[p], log_probs[p], attention))
        return out
