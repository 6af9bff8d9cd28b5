"""Greedy decoding in one call: the export's greedy loop graph (an ONNX Loop around the decoder step).

It computes what the step loop computes (the step's own nodes run inside the Loop), without one `run()` per output:
points get (N, Lt, F) outputs and attention; token models get one Hypothesis per row, cut at its eos, scored by the
summed log-probs of its tokens and eos (float64, as `runtime.search.greedy` sums them). Rows that ended keep running
inside the loop (masked) until every row has ended, where the step loop drops them: their tokens do not change.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from runtime.search.step import Hypothesis, State

from .binding import Runner
from .contract import greedy_io
from .points import Cancel  # asked while a one-call graph runs too: True stops it (runtime.errors.Cancelled)
from .spec import ModelSpec
from .vocab import EOS


@functools.lru_cache(maxsize=4096)
def scalar(value: int | float, dtype: str) -> np.ndarray:
    """A read-only 0-d array of `value`, made once: a feed's scalars cost no numpy call per decode (numpy work
    beside a run slows the run, see Vocabulary.encode_batch)."""
    array = np.array(value, dtype=dtype)
    array.flags.writeable = False
    return array


@functools.lru_cache(maxsize=4096)
def beam_scalars(max_length: int, min_length: int, beam_size: int, num_hypotheses: int,
                 length_penalty: float) -> dict[str, np.ndarray]:
    """The beam graph's scalar feeds, made once per set of options (one cache lookup a call, not five); callers copy
    the dict, never change it."""
    return {"length_penalty": scalar(length_penalty, "float64"), "max_length": scalar(max_length, "int64"),
            "min_length": scalar(min_length, "int64"), "beam_size": scalar(beam_size, "int64"),
            "num_hypotheses": scalar(num_hypotheses, "int64")}


class GreedyLoop:
    """A greedy loop session with its declared I/O; thread-safe like the session."""

    def __init__(self, spec: ModelSpec, run: Runner, io: dict[str, dict] | None = None, eos: int = EOS) -> None:
        io = greedy_io(spec) if io is None else io  # the traced loop's (a declared model's contract's), or a fast one's
        self.spec, self.eos = spec, eos  # eos: the token model's own end id
        self._run = run  # the greedy loop session's runner (errors typed, inputs on the host or the device)
        self.inputs, self.outputs = list(io["inputs"]), list(io["outputs"])
        self.reads_sources = {"source_ids", "source_lengths"} <= set(self.inputs)  # encodes inside its one call

    def points(self, states: dict[str, np.ndarray], target_len: int,
               cancel: Cancel | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Encoder states (and source_mask) -> outputs (N, Lt, F) and alphas (N, [heads,] Lt, Ls) or None; `cancel`
        stops the run while it runs (Cancelled)."""
        feed = {name: states[name] for name in self.inputs if name != "target_len"}
        feed["target_len"] = scalar(target_len, "int64")  # >= 1: checked by the caller
        result = self._run(feed, cancel)
        return result["outputs"], result.get("alphas")

    def tokens(self, state: State, max_length: int, min_length: int, return_attention: bool,
               cancel: Cancel | None = None) -> list[Hypothesis]:
        """The encoder's state -> one Hypothesis per row: tokens before its eos, summed log-prob with the eos."""
        feed = {**{name: state[name] for name in self.inputs if name in state},
                "max_length": scalar(max_length, "int64"), "min_length": scalar(min_length, "int64")}
        result = self._run(feed, cancel)
        tokens, log_probs = result["tokens"], result["token_log_probs"]  # (N, T), (N, T)
        attention = result.get("alphas") if return_attention else None  # (N, T, Ls)
        # The graph leaves 0 after a row's eos, tokens and log-probs alike, so a row's score is the in-order
        # float64 sum of its whole row (as the step loop sums them: adding 0.0 changes no sum). Summed in Python,
        # in order as np.cumsum(..., dtype=float64) would (not sum(): Python 3.12's is compensated), with less numpy
        # work beside the run (see Vocabulary.encode_batch).
        out = []
        for row, (ids, row_log_probs) in enumerate(zip(tokens.tolist(), log_probs.tolist())):
            total = 0.0
            for value in row_log_probs:
                total += value
            n = ids.index(self.eos) if self.eos in ids else len(ids)  # eos is not part of the output
            out.append(Hypothesis(tokens=ids[:n], score=total, log_prob=total,
                                  attention=None if attention is None else attention[row, :n]))
        return out


class BeamGraph:
    """A transformer's beam search graph (`export.tokens.beam`): encoder and search in one call; thread-safe."""

    def __init__(self, run: Runner) -> None:
        self._run = run

    def hypotheses(self, source_ids: np.ndarray, source_lengths: np.ndarray, beam_size: int, num_hypotheses: int,
                   length_penalty: float, max_length: int, min_length: int,
                   cancel: Cancel | None = None) -> list[list[Hypothesis]]:
        """Up to num_hypotheses Hypotheses per input, best first, as `runtime.search.beam_search` finds them (the
        arguments checked by the caller); `cancel` stops the run while it runs (Cancelled)."""
        feed = {"source_ids": source_ids, "source_lengths": source_lengths,
                **beam_scalars(max_length, min_length, beam_size, num_hypotheses, length_penalty)}
        result = self._run(feed, cancel)
        out = []  # loops, not comprehensions: fewer frames around a batch-1 call (see Vocabulary.encode_batch)
        for slots in zip(result["scores"].tolist(), result["log_probs"].tolist(), result["tokens"].tolist(),
                         result["lengths"].tolist()):
            hypotheses = []
            for score, log_prob, ids, n in zip(*slots):
                if math.isfinite(score):  # an empty slot (fewer hypotheses than asked for)
                    hypotheses.append(Hypothesis(ids[:n], score, log_prob))
            out.append(hypotheses)
        return out
