"""The beam graph's loops (`export.tokens.beam`), in one of two shapes around the same step:

- **branched** (fast_beam, wide_beam, fold_beam): one Loop; each iteration is a step, then an If that runs the
  finishing work (search.finish: new hypotheses, the n-best merge, the stopping rule, ~55 kernels) only where the
  step can change an n-best, and otherwise passes the n-best through.
- **segmented** (fold_few_beam): a Loop of segments, each a Loop of steps that ends after the first step that can
  change an n-best, then the finishing work for that step once. A step that changes nothing then runs no branch at
  all (dates transformer, beam 5, `loop_graph_ab.py` both ways against fold_beam: ~6% faster at batch 1 and 20
  forced tokens, ~4% eos free, ~2% at 2 inputs free). But a Loop copies its carried values, the caches among them,
  when it ends, so from a few inputs up, where some input finishes or fills its n-best at most steps and most steps
  end a segment, segments cost more than the If (eos free: 6-8% slower at 3 inputs, 5-8% at 4, ~6% at 8, ~8% at 15;
  1.05-1.09x for wide_beam at 64, one way): the runtime sends fold_few_beam calls of at most
  `runtime.token_steps.FEW_BEAM_INPUTS` inputs.

A step ends a run (in the branched graphs: takes the If's finishing branch) where some input has an eos among its
first k candidates (a kept candidate then sits at rank k or later), at the last step, or once some input's n-best is
full; at every other step nothing the finishing work computes changes. The step index is carried ("step"), not the
Loop's own counter, which a segment's inner Loop restarts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import onnx

from runtime.spec import ModelSpec
from training.tokens.transformer import TransformerSeq2Seq

from .kernels import BOOL, FLOAT, INT64, Net, decoder, graph, position_table, tensor
from .search import DOUBLE, NBEST, Ended, finish, select
from .search import constant as _c

if TYPE_CHECKING:
    from .beam import Outer

# The carried values: the steps' (then the self-attention caches), the n-best's with done and open (no input's
# n-best full), and what a run of steps hands its segment about the step it ended at (`ended`).
STEPS = ["step", "tokens", "live", "history", "ancestry"]
DONE_NBEST = ["done", *NBEST, "open"]
STEP_MASK = "beam/ancestry_step"  # the wide body's self-attention bias at this step (the carried mask, unsqueezed)
BLOCK_MASK = "beam/ancestry"  # the carried mask, this step's slots included, which the blocks' Attention reads


def ended(o: Outer) -> list[tuple[str, int, type]]:
    """What a run of steps hands its segment about the step it ended at (search.Ended, less its index), with each
    value's element type and numpy dtype: the token history before that step, its candidates' flat sums (and their
    tokens, where each beam's best k' are ranked first), the kept sums."""
    tokens = [("flat_tokens", INT64, np.int64)] if o.per_beam is not None else []
    return [("before", INT64, np.int64), ("flat", DOUBLE, np.float64), *tokens, ("kept", DOUBLE, np.float64)]


def carried_types(o: Outer, caches: int) -> tuple[list[int], list[int], list[int]]:
    """The element types of STEPS, of the caches and of DONE_NBEST."""
    return [INT64, INT64, DOUBLE, INT64, o.mask_type], [FLOAT] * caches, [BOOL, DOUBLE, DOUBLE, INT64, INT64, BOOL]


class Stepped(NamedTuple):
    """One step, its beams picked: STEPS' next values and the caches', the step as finish reads it, and whether no
    input has an eos among its first k candidates (a kept candidate then sits at rank k or later)."""

    steps: list[str]
    presents: list[str]
    ended: Ended
    no_eos_first: str


def _step(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, o: Outer, names: dict[str, str],
          pasts: list[str]) -> Stepped:
    """Step t (names["step"]): the decoder over the carried tokens, caches and ancestry mask, then select's k kept
    beams, each beam's token history grown by its token after its parent's. In blocks (not o.wide) every carried
    value is (B, k, ...), as select gives the kept beams, tokens and sums (B, k, 1)."""
    t = names["step"]
    table = position_table(model)
    embedding = net.weight("target_embedding", model.target_embedding.weight)
    tokens = net.one("GatherND", [embedding, names["tokens"]])  # (B, n, E)
    if o.wide:  # the decoder's rows (B * n, E)
        tokens = net.one("Reshape", [tokens, _c(net, "rows_e", [-1, spec.d_model])])
    positions = net.one("Gather", [net.weight("positions", table.detach()[:, None, :]), t])  # (1, E)
    ancestry = names["ancestry"]  # (B, n, slots) as carried, this step's n slots included
    if o.wide:  # the scores' bias (B, 1, n, slots)
        net.op("Unsqueeze", [ancestry, _c(net, "ax1", [1])], [STEP_MASK])
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, o.cross, o.attend)
    if o.wide:  # (B * n, V) -> (B, n, V)
        log_probs = net.one("Reshape", [log_probs, o.to_blocks])
    r = select(net, o, log_probs, names["live"], t)
    # select's (B, k, 1) as they come; each input's history and mask rows picked by its beams (B, k, 1), the next
    # step's k slots added to the mask
    chosen, live = r.tokens, r.kept
    grown = net.one("Concat", [net.one("GatherND", [names["history"], r.beams], batch_dims=1), chosen],
                    axis=2)  # (B, k, t + 1)
    follow = net.one("Concat", [net.one("GatherND", [ancestry, r.beams], batch_dims=1), o.own], axis=2)
    # the mask follows the picked beams; the caches stay
    steps = [net.one("Add", [t, _c(net, "one", 1)]), chosen, live, grown, follow]
    ended = Ended(t, names["history"], grown, r.flat, r.flat_tokens, r.kept)
    return Stepped(steps, presents, ended, r.no_eos_first)


def _step_net(o: Outer, int8: bool, widen: bool) -> Net:
    # Add + LayerNormalization (faster than SkipLayerNormalization at k rows an input); its caches are its own
    return Net("beam/", skip_norm=False, int8=int8, value_bias=True, rows=o.wide, widen=widen)


def _inputs(prefix: str, names: list[str], kinds: list[int]) -> list[onnx.ValueInfoProto]:
    """A Loop body's inputs: its iteration count and condition, then `names` of `kinds`."""
    return [tensor(f"{prefix}iter", INT64, []), tensor(f"{prefix}cond", BOOL, [])] + [
        tensor(n, e, None) for n, e in zip(names, kinds)]


def branched(model: TransformerSeq2Seq, spec: ModelSpec, o: Outer, int8: bool, widen: bool) -> onnx.GraphProto:
    """One step, then the finishing work in an If (or the n-best passed through): carries STEPS, the caches and
    DONE_NBEST."""
    net = _step_net(o, int8, widen)
    names = {n: f"beam/{n}" for n in (*STEPS, *DONE_NBEST)}
    pasts = [f"beam/past_{i}" for i in range(spec.layers * o.attend.CACHES)]
    s = _step(net, model, spec, o, names, pasts)
    # calm: the step can leave every n-best as it is (no eos among the first k, not the last step, none full)
    calm = net.one("And", [net.one("And", [s.no_eos_first, net.one("Less", [names["step"], o.last_iter])]),
                           names["open"]])
    step_types, cache_types, own_types = carried_types(o, len(pasts))
    branch_types = [*own_types[1:-1], BOOL, BOOL, BOOL]  # the n-best, done, open, whether to go on
    finishing = Net("beam/finish/")
    best, done, open_, more = finish(finishing, o, s.ended, [names[n] for n in NBEST], names["done"])
    outs = [*best, done, open_, more]
    finishes = graph(finishing, "beam_finish", [], [tensor(n, e, None) for n, e in zip(outs, branch_types)], "")
    same = Net("beam/same/")
    outs = [same.one("Identity", [names[n]]) for n in (*NBEST, "done", "open")]
    outs.append(same.one("Identity", [_c(same, "true", True, bool)]))
    passed = graph(same, "beam_same", [], [tensor(n, e, None) for n, e in zip(outs, branch_types)], "")
    after = net.op("If", [calm], len(branch_types), then_branch=passed, else_branch=finishes)
    outs = [after[6], *s.steps, *s.presents, after[4], *after[:4], after[5]]
    kinds = [*step_types, *cache_types, *own_types]
    return graph(net, "beam_body", _inputs("beam/", [*(names[n] for n in STEPS), *pasts,
                                                      *(names[n] for n in DONE_NBEST)], kinds),
                 [tensor(n, e, None) for n, e in zip(outs, [BOOL, *kinds])], "")


def _steps(model: TransformerSeq2Seq, spec: ModelSpec, o: Outer, int8: bool, widen: bool) -> onnx.GraphProto:
    """A segment's inner Loop body: one step; the run goes on while no input has an eos among its first k (its trip
    count ends it at the last step, or after one step once an n-best is full), and hands its segment the step it
    ended at (`ended`). Carries STEPS, the caches and `ended`."""
    net = _step_net(o, int8, widen)
    names = {n: f"beam/{n}" for n in STEPS}
    pasts = [f"beam/past_{i}" for i in range(spec.layers * o.attend.CACHES)]
    s = _step(net, model, spec, o, names, pasts)
    e = s.ended
    hands = [net.one("Identity", [e.before]), e.flat, *([e.flat_tokens] if e.flat_tokens else []), e.kept]
    outs = [s.no_eos_first, *s.steps, *s.presents, *hands]
    step_types, cache_types, _ = carried_types(o, len(pasts))
    handed = ended(o)
    kinds = [*step_types, *cache_types, *(kind for _, kind, _ in handed)]
    inputs = _inputs("beam/", [*names.values(), *pasts, *(f"beam/{n}_in" for n, _, _ in handed)], kinds)
    return graph(net, "beam_steps", inputs, [tensor(n, k, None) for n, k in zip(outs, [BOOL, *kinds])], "")


def segmented(model: TransformerSeq2Seq, spec: ModelSpec, o: Outer, int8: bool, widen: bool) -> onnx.GraphProto:
    """A segment: a run of steps (the inner Loop) up to one that can change an n-best, then the finishing work for
    that step. The run's trip count is the steps left (the last ends it), or 1 once some n-best is full (every step
    then can); its condition, that no input has an eos among its first k. Carries STEPS, the caches and
    DONE_NBEST, as `branched`."""
    net = Net("beam/seg/")
    names = {n: f"beam/seg/{n}" for n in (*STEPS, *DONE_NBEST)}
    pasts = [f"beam/seg/past_{i}" for i in range(spec.layers * o.attend.CACHES)]
    trips = net.one("Where", [names["open"], net.one("Sub", ["max_length", names["step"]]), _c(net, "one", 1)])
    # `ended`'s first values, which the segment never reads: a run of steps always runs one
    nothing = [_c(net, f"no_{n}", [], dtype) for n, _, dtype in ended(o)]
    inner = net.op("Loop", [trips, o.true, *(names[n] for n in STEPS), *pasts, *nothing],
                   len(STEPS) + len(pasts) + len(nothing), body=_steps(model, spec, o, int8, widen))
    steps, presents, hands = inner[:len(STEPS)], inner[len(STEPS):-len(nothing)], inner[-len(nothing):]
    t = net.one("Sub", [steps[0], _c(net, "one", 1)])  # the step the run ended at
    at = Ended(t, hands[0], steps[3], hands[1], hands[2] if o.per_beam is not None else None, hands[-1])
    best, done, open_, more = finish(net, o, at, [names[n] for n in NBEST], names["done"])
    step_types, cache_types, own_types = carried_types(o, len(pasts))
    kinds = [*step_types, *cache_types, *own_types]
    return graph(net, "beam_segment", _inputs("beam/seg/", [*(names[n] for n in STEPS), *pasts,
                                                             *(names[n] for n in DONE_NBEST)], kinds),
                 [tensor(n, k, None) for n, k in zip([more, *steps, *presents, done, *best, open_],
                                                     [BOOL, *kinds])], "")
