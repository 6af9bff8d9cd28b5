"""The beam graph's search rules in ONNX ops (`export.tokens.beam`, whose loops call them; the numpy search is
`runtime.search.beam`): a step's ranked candidates and the k kept, and the finishing work that runs only after a
step that can change an n-best: new hypotheses, the n-best merge and the stopping rule."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from onnx import TensorProto

from runtime.vocab import EOS

from .kernels import FLOAT, Net, eos_row

if TYPE_CHECKING:
    from .beam import Outer

DOUBLE = TensorProto.DOUBLE
NBEST = ("scores", "log_probs", "hyp_tokens", "lengths")  # the carried n-best, as `finish` returns it
# Target ids from which a step ranks each beam's best 2k first (`select`). Seeded transformers (d_model 128, 2+2
# layers), loop_graph_ab.py both ways (its time over ranking all k V, then the reversed run's ratio), 32 tokens:
# fold_few_beam batch 1 beam 5 1.05 / 0.96 at 256 ids, 1.07 / 0.97 at 1024, 1.00 / 1.03 at 4096, 0.97 / 1.06 at
# 32000; wide_beam batch 16 1.03 / 0.99 at 1024, 0.90 / 1.16 at 4096, 0.88 / 1.16 at 32000 (16 tokens).
RANK_PER_BEAM_FROM = 4096


def constant(net: Net, hint: str, value: object, dtype: type = np.int64) -> str:
    """A weight of `value` as `dtype`."""
    return net.weight(hint, np.array(value, dtype))


class Ended(NamedTuple):
    """The step a run of steps ended at, as `finish` reads it: its index t (int64 scalar), the token histories
    before it and after it (B * k, T), and its ranked candidates (Ranked's sums, index, is_eos and kept)."""

    t: str
    before: str
    grown: str
    sums: str
    index: str
    is_eos: str
    kept: str


class Ranked(NamedTuple):
    """One step's candidates: each input's best m extensions (sums, flat index beam * V + token, is_eos: (B, m))
    and the k kept as live beams (beams, tokens, sums: (B, k)), and where they sit among the m (pick)."""

    sums: str
    index: str
    is_eos: str
    pick: str
    beams: str
    tokens: str
    kept: str


def select(net: Net, o: Outer, log_probs: str, live: str, t: str) -> Ranked:
    """Step t's log-probs (B, k, V) and live sums (B, k, 1) (wide: (B * k, V) and (B * k, 1)) -> the ranked
    candidates and the k kept: the first k non-eos in rank order (there are always k: at most one eos per beam among
    the 2k). From RANK_PER_BEAM_FROM ids (o.per_beam) each beam's best k' = min(2k, V) come first, by a float32 TopK
    over its row: adding the beam's sum keeps their order (and ties stay by token), and the best 2k of an input are
    among its beams' best 2k, so the float64 ranking then reads k k' values an input, not k V."""
    scored = net.one("Add", [log_probs, eos_row(net, o.min_length, t)])  # -inf on eos below min_length
    tokens = None
    if o.per_beam is not None:
        scored, tokens = net.op("TopK", [scored, o.per_beam], 2, axis=-1)  # (B, k, k') each
    flat = net.one("Reshape", [net.one("Add", [net.one("Cast", [scored], to=DOUBLE), live]), o.kv])  # (B, k V | k k')
    sums, index = net.op("TopK", [flat, o.m], 2, axis=1)  # (B, m): ties by the lower index, as a stable sort
    vocab = constant(net, "v", o.spec.target_vocab_size)
    if tokens is not None:  # position beam * k' + j -> the flat index beam * V + token
        token = net.one("GatherElements", [net.one("Reshape", [tokens, o.kv]), index], axis=1)
        index = net.one("Add", [net.one("Mul", [net.one("Div", [index, o.per_beam]), vocab]), token])
    is_eos = net.one("Equal", [net.one("Mod", [index, vocab]), constant(net, "eos", EOS)])
    key = net.one("Where", [is_eos, o.rank_after, o.rank])  # (B, m): non-eos first, in rank order
    _, pick = net.op("TopK", [key, o.k], 2, axis=1, largest=0)  # (B, k)
    kept_index = net.one("GatherElements", [index, pick], axis=1)
    beams, tokens = net.one("Div", [kept_index, vocab]), net.one("Mod", [kept_index, vocab])
    return Ranked(sums, index, is_eos, pick, beams, tokens, net.one("GatherElements", [sums, pick], axis=1))


def _ends(net: Net, o: Outer, r: Ended, done: str, last: str) -> tuple[str, ...]:
    """Step r.t's finished hypotheses: eos among the first k candidates, and at max_length the live beams;
    scores, log-probs, tokens (B, 2k, T) and lengths, -inf where none (or the input is done)."""
    zero, k, axis = constant(net, "zero_d1", [0]), o.k, constant(net, "ax1", [1])
    sums, index, is_eos = (net.one("Slice", [a, zero, k, axis]) for a in (r.sums, r.index, r.is_eos))  # (B, k)
    beams = net.one("Div", [index, constant(net, "v", o.spec.target_vocab_size)])
    step_len = net.one("Add", [r.t, constant(net, "one", 1)])
    norm = net.one("Pow", [net.one("Cast", [step_len], to=DOUBLE), "length_penalty"])
    running = net.one("Unsqueeze", [net.one("Not", [done]), axis])  # (B, 1)
    minus_inf = constant(net, "minus_inf", -np.inf, np.float64)
    found = net.one("And", [net.one("And", [is_eos, net.one("Greater", [sums, minus_inf])]), running])
    ending = net.one("And", [net.one("And", [net.one("Greater", [r.kept, minus_inf]), running]), last])
    scores = net.one("Concat", [net.one("Where", [found, net.one("Div", [sums, norm]), minus_inf]),
                                net.one("Where", [ending, net.one("Div", [r.kept, norm]), minus_inf])], axis=1)
    log_probs = net.one("Concat", [sums, r.kept], axis=1)  # (B, 2k)
    parents = net.one("Gather", [r.before, net.one("Add", [o.base, beams])], axis=0)  # (B, k, T): eos excluded
    tokens = net.one("Concat", [parents, net.one("Reshape", [r.grown, o.shape_bkt])], axis=1)  # (B, 2k, T)
    lengths = net.one("Concat", [net.one("Expand", [r.t, o.shape_bk]),
                                 net.one("Expand", [step_len, o.shape_bk])], axis=1)
    return scores, log_probs, tokens, lengths, step_len


def _merge(net: Net, o: Outer, old: list[str], new: tuple[str, ...]) -> list[str]:
    """Each input's n-best after this step: one TopK over (n-best, new); ties keep the earlier (stable)."""
    scores, index = net.op("TopK", [net.one("Concat", [old[0], new[0]], axis=1), o.h], 2, axis=1)  # (B, H)
    log_probs = net.one("GatherElements", [net.one("Concat", [old[1], new[1]], axis=1), index], axis=1)
    wide = net.one("Expand", [net.one("Unsqueeze", [index, constant(net, "ax2", [2])]), o.shape_bht])  # (B, H, T)
    tokens = net.one("GatherElements", [net.one("Concat", [old[2], new[2]], axis=1), wide], axis=1)
    lengths = net.one("GatherElements", [net.one("Concat", [old[3], new[3]], axis=1), index], axis=1)
    return [scores, log_probs, tokens, lengths]


def _done(net: Net, o: Outer, scores: str, live: str, step_len: str, done: str,
          last: str) -> tuple[str, str, str]:
    """done or (n-best full and no live beam can beat the worst): (B,); whether no input's n-best is full yet (open);
    and whether any input is still running."""
    worst = net.one("ReduceMin", [scores], axes=[1], keepdims=1)  # (B, 1): -inf while not full
    minus_inf = constant(net, "minus_inf", -np.inf, np.float64)
    full = net.one("Greater", [worst, minus_inf])
    best = net.one("ReduceMax", [live], axes=[1], keepdims=1)  # (B, 1)
    after = net.one("Pow", [net.one("Cast", [net.one("Add", [step_len, constant(net, "one", 1)])], to=DOUBLE),
                            "length_penalty"])
    bound = net.one("Max", [net.one("Div", [best, after]), net.one("Div", [best, o.max_pow])])
    bound = net.one("Where", [last, minus_inf, bound])
    stops = net.one("And", [full, net.one("LessOrEqual", [bound, worst])])  # (B, 1)
    done = net.one("Or", [done, net.one("Squeeze", [stops, constant(net, "ax1", [1])])])
    open_ = net.one("Equal", [net.one("ReduceMax", [worst], keepdims=0), minus_inf])  # every worst -inf: none full
    least = net.one("ReduceMin", [net.one("Cast", [done], to=FLOAT)], keepdims=0)
    return done, open_, net.one("Less", [least, constant(net, "half", 0.5, np.float32)])


def finish(net: Net, o: Outer, r: Ended, nbest: list[str], done: str) -> tuple[list[str], str, str, str]:
    """After step r.t, where some input may have finished a hypothesis or some n-best is full (or it is the last):
    record the step's finished hypotheses in the n-best (NBEST's four) and test the stopping rule; returns the
    n-best, done (B,), whether no input's n-best is full yet, and whether to go on (an input still running before
    max_length)."""
    last = net.one("Equal", [r.t, o.last_iter])
    ends = _ends(net, o, r, done, last)
    best = _merge(net, o, nbest, ends[:4])
    done, open_, running = _done(net, o, best[0], r.kept, ends[4], done, last)
    return best, done, open_, net.one("And", [running, net.one("Not", [last])])
