"""A transformer's beam search in one graph (fast_beam.onnx, wide_beam.onnx): the encoder, then an ONNX Loop whose
body is the fast decoder step and `runtime.search.beam`'s rules written in ONNX ops, so one `run` decodes a batch.

Rows are (batch x beam), input b owning rows b*k .. b*k+k-1; the cross-attention keys/values stay once per input,
and an input's k queries attend to them as one block (CTranslate2's layout; kernels.FoldedFused). Each step, as the
numpy search: log-probs (eos at -inf below min_length) plus each row's summed log-prob (float64), the best min(2k,
kV) extensions per input by TopK (ties: the lower flat index, as a stable sort), eos among the first k of them
becomes a finished hypothesis scored sum / (t + 1) ** length_penalty, the first k non-eos stay live, and at
max_length the live ones end as they are. Finished hypotheses merge into each input's n-best by one TopK over
(n-best, new) (ties: earlier first, as a stable sort). An input is done when its n-best is full and no live beam can
beat the worst (the same bound); done inputs keep running, masked, until all are done. Token histories are kept per
row (batch x beam, max_length), reordered with the caches.

Inputs: source_ids, source_lengths, max_length, min_length, beam_size, num_hypotheses (int64 scalars) and
length_penalty (float64 scalar). Outputs (batch, num_hypotheses[, max_length]): scores, log_probs (float64), tokens
and lengths (int64); a slot with score -inf holds no hypothesis.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from runtime.contract import fast_graph_io
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS
from training.tokens.transformer import TransformerSeq2Seq

from .attention import FoldedBatched, FoldedFused, Fused, mask_bias
from .kernels import (
    BOOL,
    FLOAT,
    INT32,
    INT64,
    Net,
    cross_kv,
    decoder,
    encoder,
    graph,
    position_table,
    tensor,
)

DOUBLE = TensorProto.DOUBLE
CARRIED = ["tokens", "live", "history", "done", "scores", "log_probs", "hyp_tokens", "lengths"]


def _c(net: Net, hint: str, value: object, dtype: type = np.int64) -> str:
    return net.weight(hint, np.array(value, dtype))


class Outer:
    """The outer graph's values the body reads: sizes, shapes, the expanded cross-attention and the eos table."""

    def __init__(self, net: Net, model: TransformerSeq2Seq, spec: ModelSpec, wide: bool) -> None:
        self.spec = spec
        lengths32 = net.one("Cast", ["source_lengths"], to=INT32)
        cross = cross_kv(net, model, spec, encoder(net, model, spec, "source_ids", lengths32))
        self.batch = net.one("Shape", ["source_lengths"])  # (1,)
        self.k = net.one("Reshape", ["beam_size", _c(net, "one_d", [1])])  # (1,)
        self.h = net.one("Reshape", ["num_hypotheses", _c(net, "one_d", [1])])  # (1,)
        self.rows = net.one("Mul", [self.batch, self.k])  # (1,): batch x beam
        index = net.one("Range", [_c(net, "zero", 0), net.one("Squeeze", [self.batch]), _c(net, "one", 1)])  # (B,)
        self.base = net.one("Mul", [net.one("Unsqueeze", [index, _c(net, "ax1", [1])]), "beam_size"])  # (B, 1)
        shape_bk = net.one("Concat", [self.batch, self.k], axis=0)
        self.cross = cross  # (B, h, Ls, d) each: an input's beams attend to it together (kernels.FoldedFused)
        if wide:
            fold = net.one("Concat", [self.batch, _c(net, "fold", [-1, spec.n_heads, spec.head_dim])], axis=0)
            self.attend = FoldedBatched(mask_bias(net, lengths32, cross[0]), fold)
        else:
            fold = net.one("Concat", [self.batch, _c(net, "fold", [-1, spec.d_model])], axis=0)
            self.attend = FoldedFused(lengths32, fold)
        self.shape_bk = shape_bk
        vocab = spec.target_vocab_size
        self.kv = net.one("Concat", [self.batch, net.one("Mul", [self.k, _c(net, "v", [vocab])])], axis=0)
        self.m = net.one("Min", [net.one("Mul", [self.k, _c(net, "two", [2])]),
                                 net.one("Mul", [self.k, _c(net, "v", [vocab])])])  # (1,): min(2k, kV)
        self.m_scalar = net.one("Squeeze", [self.m])
        self.rank = net.one("Range", [_c(net, "zero", 0), self.m_scalar, _c(net, "one", 1)])  # (m,)
        steps = net.one("Range", [_c(net, "zero", 0), "max_length", _c(net, "one", 1)])  # (T,)
        self.steps = steps
        self.shape_bkt = net.one("Concat", [shape_bk, net.one("Reshape", ["max_length", _c(net, "one_d", [1])])],
                                 axis=0)  # [B, k, T]
        self.shape_bht = net.one("Concat", [self.batch, self.h, net.one("Reshape", ["max_length",
                                                                                   _c(net, "one_d", [1])])], axis=0)
        self.max_pow = net.one("Pow", [net.one("Cast", ["max_length"], to=DOUBLE), "length_penalty"])
        eos = np.zeros(vocab, np.float32)
        eos[EOS] = -np.inf
        early = net.one("Unsqueeze", [net.one("Less", [steps, "min_length"]), _c(net, "ax1", [1])])  # (T, 1)
        self.penalties = net.one("Where", [early, net.weight("eos_penalty", eos),
                                           net.weight("no_penalty", np.zeros_like(eos))])  # (T, V)


def _first(net: Net, o: Outer, spec: ModelSpec) -> list[str]:
    """The carried values' first values: bos, live [0, -inf, ...] per input, empty history and n-best, no input
    done, empty caches."""
    column = net.one("Concat", [o.rows, _c(net, "one_d", [1])], axis=0)
    tokens = net.one("Expand", [_c(net, "bos", [[BOS]]), column])  # (B * k, 1)
    beam = net.one("Range", [_c(net, "zero", 0), "beam_size", _c(net, "one", 1)])  # (k,)
    first = net.one("Where", [net.one("Equal", [beam, _c(net, "zero", 0)]), _c(net, "zero_d", 0.0, np.float64),
                              _c(net, "minus_inf", -np.inf, np.float64)])  # (k,)
    live = net.one("Reshape", [net.one("Expand", [first, o.shape_bk]), _c(net, "flat", [-1])])  # (B * k,)
    history = net.one("ConstantOfShape", [net.one("Concat", [o.rows, net.one("Reshape", [
        "max_length", _c(net, "one_d", [1])])], axis=0)], value=helper.make_tensor("z", INT64, [1], [0]))
    done = net.one("ConstantOfShape", [o.batch], value=helper.make_tensor("f", BOOL, [1], [False]))
    shape_bh = net.one("Concat", [o.batch, o.h], axis=0)
    scores = net.one("Expand", [_c(net, "minus_inf", -np.inf, np.float64), shape_bh])  # (B, H)
    log_probs = net.one("Expand", [_c(net, "zero_d", 0.0, np.float64), shape_bh])
    hyp_tokens = net.one("ConstantOfShape", [o.shape_bht], value=helper.make_tensor("z", INT64, [1], [0]))
    lengths = net.one("Expand", [_c(net, "zero", 0), shape_bh])
    empty = net.one("ConstantOfShape", [net.one("Concat", [_c(net, "two", [2]), o.rows, _c(
        net, "hd", [spec.n_heads, 0, spec.head_dim])], axis=0)], value=helper.make_tensor("z", FLOAT, [1], [0.0]))
    return [tokens, live, history, done, scores, log_probs, hyp_tokens, lengths] + [empty] * spec.layers


def _select(net: Net, o: Outer, log_probs: str, live: str) -> tuple[str, ...]:
    """The step's log-probs (B * k, 1, V) and live sums -> the ranked candidates (sums, beams, tokens, eos: (B, m))
    and the k kept (beams, tokens, sums with eos fillers at -inf: (B, k))."""
    step = net.one("Gather", [o.penalties, "beam/iter"])  # (V,): -inf on eos below min_length
    wide = net.one("Cast", [net.one("Add", [log_probs, step])], to=DOUBLE)  # (B * k, 1, V)
    sums = net.one("Add", [net.one("Squeeze", [wide, _c(net, "ax1", [1])]),
                           net.one("Unsqueeze", [live, _c(net, "ax1", [1])])])  # (B * k, V)
    sums, index = net.op("TopK", [net.one("Reshape", [sums, o.kv]), o.m], 2, axis=1)  # (B, m)
    vocab = _c(net, "v", o.spec.target_vocab_size)
    beams, tokens = net.one("Div", [index, vocab]), net.one("Mod", [index, vocab])
    is_eos = net.one("Equal", [tokens, _c(net, "eos", EOS)])
    key = net.one("Add", [net.one("Mul", [net.one("Cast", [is_eos], to=INT64), o.m_scalar]), o.rank])
    _, pick = net.op("TopK", [key, o.k], 2, axis=1, largest=0)  # (B, k): non-eos first, in rank order
    kept = [net.one("GatherElements", [a, pick], axis=1) for a in (beams, tokens, sums)]
    kept[2] = net.one("Where", [net.one("Equal", [kept[1], _c(net, "eos", EOS)]),
                                _c(net, "minus_inf", -np.inf, np.float64), kept[2]])
    return sums, beams, tokens, is_eos, *kept


def _ends(net: Net, o: Outer, ranked: tuple[str, ...], history: str, grown: str, done: str) -> tuple[str, ...]:
    """This step's finished hypotheses: eos among the first k candidates, and at max_length the live beams;
    scores, log-probs, tokens (B, 2k, T) and lengths, -inf where none (or the input is done)."""
    sums, beams, _, is_eos, _, _, live = ranked
    zero, k = _c(net, "zero_d1", [0]), o.k
    first = [net.one("Slice", [a, zero, k, _c(net, "ax1", [1])]) for a in (sums, beams, is_eos)]  # (B, k)
    step_len = net.one("Add", ["beam/iter", _c(net, "one", 1)])
    norm = net.one("Pow", [net.one("Cast", [step_len], to=DOUBLE), "length_penalty"])
    running = net.one("Unsqueeze", [net.one("Not", [done]), _c(net, "ax1", [1])])  # (B, 1)
    minus_inf = _c(net, "minus_inf", -np.inf, np.float64)
    found = net.one("And", [net.one("And", [first[2], net.one("Greater", [first[0], minus_inf])]), running])
    last = net.one("Equal", [step_len, "max_length"])
    ending = net.one("And", [net.one("And", [net.one("Greater", [live, minus_inf]), running]), last])
    scores = net.one("Concat", [net.one("Where", [found, net.one("Div", [first[0], norm]), minus_inf]),
                                net.one("Where", [ending, net.one("Div", [live, norm]), minus_inf])], axis=1)
    log_probs = net.one("Concat", [first[0], live], axis=1)  # (B, 2k)
    parents = net.one("Gather", [history, net.one("Add", [o.base, first[1]])], axis=0)  # (B, k, T): eos excluded
    tokens = net.one("Concat", [parents, net.one("Reshape", [grown, o.shape_bkt])], axis=1)  # (B, 2k, T)
    lengths = net.one("Concat", [net.one("Expand", ["beam/iter", o.shape_bk]),
                                 net.one("Expand", [step_len, o.shape_bk])], axis=1)
    return scores, log_probs, tokens, lengths, last, step_len


def _merge(net: Net, o: Outer, old: list[str], new: tuple[str, ...]) -> list[str]:
    """Each input's n-best after this step: one TopK over (n-best, new); ties keep the earlier (stable)."""
    scores, index = net.op("TopK", [net.one("Concat", [old[0], new[0]], axis=1), o.h], 2, axis=1)  # (B, H)
    log_probs = net.one("GatherElements", [net.one("Concat", [old[1], new[1]], axis=1), index], axis=1)
    wide = net.one("Expand", [net.one("Unsqueeze", [index, _c(net, "ax2", [2])]), o.shape_bht])  # (B, H, T)
    tokens = net.one("GatherElements", [net.one("Concat", [old[2], new[2]], axis=1), wide], axis=1)
    lengths = net.one("GatherElements", [net.one("Concat", [old[3], new[3]], axis=1), index], axis=1)
    return [scores, log_probs, tokens, lengths]


def _done(net: Net, o: Outer, scores: str, live: str, last: str, step_len: str, done: str) -> str:
    """done or (n-best full and no live beam can beat the worst): (B,)."""
    worst = net.one("ReduceMin", [scores], axes=[1], keepdims=1)  # (B, 1): -inf while not full
    minus_inf = _c(net, "minus_inf", -np.inf, np.float64)
    full = net.one("Greater", [worst, minus_inf])
    best = net.one("ReduceMax", [live], axes=[1], keepdims=1)  # (B, 1)
    after = net.one("Pow", [net.one("Cast", [net.one("Add", [step_len, _c(net, "one", 1)])], to=DOUBLE),
                            "length_penalty"])
    bound = net.one("Max", [net.one("Div", [best, after]), net.one("Div", [best, o.max_pow])])
    bound = net.one("Where", [last, minus_inf, bound])
    stops = net.one("And", [full, net.one("LessOrEqual", [bound, worst])])  # (B, 1)
    return net.one("Or", [done, net.one("Squeeze", [stops, _c(net, "ax1", [1])])])


def _body(model: TransformerSeq2Seq, spec: ModelSpec, o: Outer, int8: bool) -> onnx.GraphProto:
    net = Net("beam/", skip_norm=isinstance(o.attend, Fused), int8=int8)
    names = {n: f"beam/{n}" for n in CARRIED}
    pasts = [f"beam/past_{i}" for i in range(spec.layers)]
    table = position_table(model)
    tokens = net.one("Gather", [net.weight("target_embedding", model.target_embedding.weight), names["tokens"]])
    positions = net.one("Gather", [net.weight("positions", table.detach()[:, None, :]), "beam/iter"])  # (1, E)
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, o.cross, o.attend)
    ranked = _select(net, o, log_probs, names["live"])
    parents = net.one("Reshape", [net.one("Add", [o.base, ranked[4]]), _c(net, "flat", [-1])])  # (B * k,)
    chosen = net.one("Reshape", [ranked[5], _c(net, "column", [-1, 1])])  # (B * k, 1)
    at_step = net.one("Equal", [o.steps, "beam/iter"])  # (T,)
    grown = net.one("Where", [at_step, chosen, net.one("Gather", [names["history"], parents], axis=0)])
    ends = _ends(net, o, ranked, names["history"], grown, names["done"])
    best = _merge(net, o, [names[n] for n in CARRIED[4:]], ends[:4])
    done = _done(net, o, best[0], ranked[6], ends[4], ends[5], names["done"])
    least = net.one("ReduceMin", [net.one("Cast", [done], to=FLOAT)], keepdims=0)
    cond = net.one("Less", [least, _c(net, "half", 0.5, np.float32)])
    live = net.one("Reshape", [ranked[6], _c(net, "flat", [-1])])
    outs = [cond, chosen, live, grown, done, *best]
    outs += [net.one("Gather", [p, parents], axis=1) for p in presents]  # the caches follow their rows
    types = [BOOL, INT64, DOUBLE, INT64, BOOL, DOUBLE, DOUBLE, INT64, INT64] + [FLOAT] * spec.layers
    inputs = [tensor("beam/iter", INT64, []), tensor("beam/cond", BOOL, [])]
    inputs += [tensor(names[n], t, None) for n, t in zip(CARRIED, types[1:])] + [tensor(p, FLOAT, None)
                                                                                for p in pasts]
    return graph(net, "beam_body", inputs, [tensor(n, t, None) for n, t in zip(outs, types)], "")


def beam_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, wide: bool = False,
               int8: bool = False) -> onnx.ModelProto:
    """The beam search graph, declared as `contract.fast_graph_io(spec)["beam"]`."""
    from .fast import TYPES, _inputs, _model  # fast.py lists this builder among its graphs

    io = fast_graph_io(spec)["beam"]
    net = Net(skip_norm=False, int8=int8)
    outer = Outer(net, model, spec, wide)
    first = _first(net, outer, spec)
    outs = net.op("Loop", ["max_length", _c(net, "true", True, bool), *first], len(first),
                  body=_body(model, spec, outer, int8))
    for name, value in zip(("scores", "log_probs", "tokens", "lengths"), outs[4:8]):
        net.op("Identity", [value], [name])
    types = {**TYPES, "length_penalty": DOUBLE, "scores": DOUBLE, "log_probs": DOUBLE}
    return _model(graph(net, "fast_beam", _inputs(io["inputs"], types), _inputs(io["outputs"], types), doc))
