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
    before it (B * k, t) and after it (B * k, t + 1), and its candidates and kept sums (Ranked's flat, flat_tokens
    and kept). In blocks (not Outer.wide) as the step keeps them, (B, n, t), (B, k, t + 1) and so on, n being the
    step's rows an input (1 at step 0 where Outer.first_rows is 1, else k; `_as_rows`)."""

    t: str
    before: str
    grown: str
    flat: str
    flat_tokens: str | None
    kept: str


class Ranked(NamedTuple):
    """One step's candidates: every extension's summed log-prob, flat (B, k V) by index beam * V + token (from
    RANK_PER_BEAM_FROM ids each beam's best k' only, (B, k k'), with their tokens in flat_tokens, else None); the k
    kept as live beams (beams, tokens, sums: (B, k)); and whether no input has an eos among its first k candidates
    (a bool scalar). In blocks (not Outer.wide) the k kept (B, k, 1) and the candidates of the step's n rows an
    input (B, n k', 1), or, by every id, unflattened (B, n, V) without eos's row (Outer.eos_bar)."""

    flat: str
    flat_tokens: str | None
    beams: str
    tokens: str
    kept: str
    no_eos_first: str


def select(net: Net, o: Outer, log_probs: str, live: str, t: str) -> Ranked:
    """Step t's log-probs (B, n, V) and live sums (B, n, 1) (n: the step's rows an input, Ended; wide: (B * k, V)
    and (B * k, 1)) -> the candidates and the k kept: the first k non-eos in rank order, one TopK over the sums with
    every eos at -inf (ties by the lower index, as a stable sort over all of them would keep them). No eos is among an input's first k candidates where
    every eos sum is below its k-th kept sum; an eos that ties it counts as among them (finish then ranks exactly,
    and finds nothing where it was not). From RANK_PER_BEAM_FROM ids (o.per_beam) each beam's best k' = min(2k, V)
    come first, by a float32 TopK over its row: adding the beam's sum keeps their order (and ties stay by token),
    and an input's best 2k are among its beams' best 2k, so the float64 ranking then reads k k' values an input, not
    k V. With Outer.eos_bar the sums leave eos's row out: the kept are the same (every eos is masked for them), and
    where min_length blocks eos the test for an eos among the first k compares with -inf, so that only an input
    whose k-th kept is -inf (where finish runs anyway) counts as having one; finish adds the row to what it ranks."""
    scored = log_probs
    if o.eos_bar is None:
        scored = net.one("Add", [log_probs, eos_row(net, o.min_length, t)])  # -inf on eos below min_length
    flat_tokens = None
    if o.per_beam is not None:
        scored, flat_tokens = net.op("TopK", [scored, o.per_beam], 2, axis=-1)  # (B, n, k') each
        flat_tokens = net.one("Reshape", [flat_tokens, o.kv])  # (B, n k', 1)
    sums = net.one("Add", [net.one("Cast", [scored], to=DOUBLE), live])  # (B, n, V | k')
    if flat_tokens is None:  # the sums as they are (finish flattens them), eos's from them
        flat, masked = sums, net.one("Reshape", [net.one("Add", [sums, o.no_eos]), o.kv])  # (B, n V, 1)
        eos_sums = net.one("Gather", [sums, constant(net, "eos_d1", [EOS])], axis=2)  # (B, n, 1)
        kept, position = net.op("TopK", [masked, o.k], 2, axis=1)  # (B, k, 1)
        vocab = constant(net, "v", o.spec.target_vocab_size)
        beams, tokens = net.one("Div", [position, vocab]), net.one("Mod", [position, vocab])
    else:
        flat = net.one("Reshape", [sums, o.kv])  # (B, n k', 1)
        is_eos = net.one("Equal", [flat_tokens, constant(net, "eos", EOS)])
        minus_inf = constant(net, "minus_inf", -np.inf, np.float64)
        masked, eos_sums = (net.one("Where", [is_eos, a, b]) for a, b in ((minus_inf, flat), (flat, minus_inf)))
        kept, position = net.op("TopK", [masked, o.k], 2, axis=1)
        beams = net.one("Div", [position, o.per_beam])
        tokens = net.one("GatherElements", [flat_tokens, position], axis=1)
    # each input's k-th kept sum less each of its eos sums: all above 0, or the step may finish a hypothesis. The
    # k-th kept is -inf where an input has fewer than k finite non-eos candidates (a beam wider than the vocabulary
    # less eos): a finite eos then gives -inf (finish runs), an eos at -inf NaN (it finishes nothing either way)
    below = net.one("Sub", [net.one("Gather", [kept, o.k_last], axis=1), eos_sums])  # (B, 1) - (B, k | k k')
    # eos's bar: 0, or where the sums left eos's row out, -inf while min_length blocks eos (no eos can be first)
    bar = constant(net, "zero_d", 0.0, np.float64) if o.eos_bar is None else net.one("Gather", [o.eos_bar, t])
    no_eos_first = net.one("Greater", [net.one("ReduceMin", [below], keepdims=0), bar])
    return Ranked(flat, flat_tokens, beams, tokens, kept, no_eos_first)


def _ends(net: Net, o: Outer, r: Ended, done: str, last: str) -> tuple[str, ...]:
    """Step r.t's finished hypotheses: eos among the first k candidates, and at max_length the live beams;
    scores, log-probs, tokens (B, 2k, T) and lengths, -inf where none (or the input is done)."""
    sums, position = net.op("TopK", [r.flat, o.k], 2, axis=1)  # (B, k): the first k candidates, ties as select's
    if r.flat_tokens is None:
        vocab = constant(net, "v", o.spec.target_vocab_size)
        beams, token = net.one("Div", [position, vocab]), net.one("Mod", [position, vocab])
    else:
        beams = net.one("Div", [position, o.per_beam])
        token = net.one("GatherElements", [r.flat_tokens, position], axis=1)
    is_eos = net.one("Equal", [token, constant(net, "eos", EOS)])
    axis = constant(net, "ax1", [1])
    step_len = net.one("Add", [r.t, constant(net, "one", 1)])
    norm = net.one("Pow", [net.one("Cast", [step_len], to=DOUBLE), "length_penalty"])
    running = net.one("Unsqueeze", [net.one("Not", [done]), axis])  # (B, 1)
    minus_inf = constant(net, "minus_inf", -np.inf, np.float64)
    found = net.one("And", [net.one("And", [is_eos, net.one("Greater", [sums, minus_inf])]), running])
    ending = net.one("And", [net.one("And", [net.one("Greater", [r.kept, minus_inf]), running]), last])
    scores = net.one("Concat", [net.one("Where", [found, net.one("Div", [sums, norm]), minus_inf]),
                                net.one("Where", [ending, net.one("Div", [r.kept, norm]), minus_inf])], axis=1)
    log_probs = net.one("Concat", [sums, r.kept], axis=1)  # (B, 2k)
    parents = net.one("GatherND", [r.before, net.one("Unsqueeze", [beams, constant(net, "ax2", [2])])],
                      batch_dims=1)  # (B, k, t): eos excluded
    parents = net.one("Pad", [parents, constant(net, "one_more", [0, 0, 0, 0, 0, 1])])  # (B, k, t + 1)
    tokens = net.one("Concat", [parents, r.grown], axis=1)  # (B, 2k, t + 1)
    rest = net.one("Reshape", [net.one("Sub", ["max_length", step_len]), constant(net, "one_d", [1])])
    pads = net.one("Concat", [constant(net, "none_before", [0, 0, 0, 0, 0]), rest], axis=0)
    tokens = net.one("Pad", [tokens, pads])  # (B, 2k, T): 0 after each hypothesis, as the n-best's
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


def _as_rows(net: Net, o: Outer, r: Ended) -> Ended:
    """A step in blocks (B, n, ...) as `finish` reads it: the candidates (B, n V | n k') with eos's row added where
    the step left it out (Outer.eos_bar), the kept sums (B, k); the histories stay (B, n, t) and (B, k, t + 1)."""
    to_rows = constant(net, "to_rows", [0, -1])  # (B, n, m) -> (B, n m)
    flat = r.flat
    if o.eos_bar is not None:  # (B, n, V)
        flat = net.one("Add", [flat, eos_row(net, o.min_length, r.t)])
    flat_tokens = r.flat_tokens and net.one("Reshape", [r.flat_tokens, to_rows])
    return Ended(r.t, r.before, r.grown, net.one("Reshape", [flat, to_rows]), flat_tokens,
                 net.one("Reshape", [r.kept, to_rows]))


def finish(net: Net, o: Outer, r: Ended, nbest: list[str], done: str) -> tuple[list[str], str, str, str]:
    """After step r.t, where some input may have finished a hypothesis or some n-best is full (or it is the last):
    record the step's finished hypotheses in the n-best (NBEST's four) and test the stopping rule; returns the
    n-best, done (B,), whether no input's n-best is full yet, and whether to go on (an input still running before
    max_length)."""
    r = _as_rows(net, o, r)
    last = net.one("Equal", [r.t, o.last_iter])
    ends = _ends(net, o, r, done, last)
    best = _merge(net, o, nbest, ends[:4])
    done, open_, running = _done(net, o, best[0], r.kept, ends[4], done, last)
    return best, done, open_, net.one("And", [running, net.one("Not", [last])])
