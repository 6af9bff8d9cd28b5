"""Random sampling: each row draws its next token from the filtered distribution; finished rows leave the batch."""
from __future__ import annotations

import numpy as np

from runtime.errors import InputError

from .filters import check_temperature, check_topp, filter_logits
from .greedy import rollout
from .step import BatchAxes, Hypothesis, State, StepFn, check_int

MAX_SEED = 2**64 - 1  # an unsigned 64-bit integer, as CTranslate2's sampling seed


def sample(step: StepFn, state: State, batch_axes: BatchAxes, batch_size: int, bos_id: int, eos_id: int,
           max_decoding_length: int, min_decoding_length: int = 0, sampling_temperature: float = 1.0,
           sampling_topk: int = 0, sampling_topp: float = 1.0, seed: int | None = None,
           return_attention: bool = False, constant: frozenset[str] = frozenset(),
           never: tuple[int, ...] = ()) -> list[Hypothesis]:
    """One sampled Hypothesis per input; the same call with the same `seed` gives the same output.

    Filters run temperature -> top-k (0 = off) -> top-p (1.0 = off) on the step's log-probs. Scores and log_probs
    are sums of the model's own log-probs of the drawn tokens, before any filter, so they compare with greedy's.
    `constant` names the state entries the step never changes. `never`: ids never drawn, whatever the filters
    (seq2onnx's own steps put <pad> and <s> at -1e4, not -inf, which a temperature of 1e4 or more brings near 0).
    """
    check_temperature("sampling_temperature", sampling_temperature)
    check_int("sampling_topk", sampling_topk, 0)
    check_topp("sampling_topp", sampling_topp)
    if seed is not None:
        check_int("seed", seed, 0, MAX_SEED)
    never = [check_int("never", i, 0) for i in never]
    rng = np.random.default_rng(seed)

    def pick(log_probs: np.ndarray) -> np.ndarray:
        scores = log_probs.astype(np.float64)  # a copy
        if never:
            if max(never) >= scores.shape[1]:
                raise InputError(f"never: ids must be below the vocabulary's {scores.shape[1]}, got {max(never)}")
            scores[:, never] = -np.inf
        logits = filter_logits(scores, sampling_temperature, sampling_topk, sampling_topp)
        # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits); -inf tokens are never drawn.
        return np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)  # (B,)

    return rollout(step, state, batch_axes, batch_size, bos_id, eos_id, max_decoding_length,
                   min_decoding_length, return_attention, pick, constant)
