"""A transformer's beam search in one graph (fast_beam.onnx, wide_beam.onnx, fold_beam.onnx, fold_few_beam.onnx): the
encoder, then an ONNX Loop of the fast decoder step and `runtime.search.beam`'s rules written in ONNX ops, so one
`run` decodes a batch.

Rows are (batch x beam), input b owning rows b*k .. b*k+k-1, and the decoder reads them as (B, k, E) blocks: an
input's k queries attend as one block to its one copy of the cross-attention keys/values and to its own append-only
self-attention cache, where each step writes its rows' slots after the ones before (k a step, one at step 0 where
it runs one row an input: below); a mask (B, k, slots) of the slots each beam's ancestors wrote is reordered when
beams are picked, the caches never are (attention.AncestryFused). Each step, as the
numpy search: log-probs (eos at -inf below min_length) plus each row's summed log-prob (float64), the best min(2k,
kV) extensions per input by TopK (ties: the lower flat index, as a stable sort), eos among the first k of them
becomes a finished hypothesis scored sum / (t + 1) ** length_penalty, the first k non-eos stay live, and at
max_length the live ones end as they are. Finished hypotheses merge into each input's n-best by one TopK over
(n-best, new) (ties: earlier first, as a stable sort). An input is done when its n-best is full and no live beam can
beat the worst (the same bound); done inputs keep running, masked, until all are done. A step keeps its k live
beams by one TopK with every eos masked, and ranks its first k candidates only where an eos may be among them
(search.select). Token histories are kept per beam (B, k, t), the steps so far: a column more a step, one Concat
where writing column t of a (rows, max_length) table took an Equal and a Where (fold_few_beam batch 1, beam 5, 20
tokens ~1.4% faster), reordered with the mask, and padded to max_length where the finishing work records a
hypothesis. A step keeps its values in blocks as select leaves them, (B, k, 1): the picked beams pick each input's
history and mask rows (GatherND, batch_dims 1) and its kept sums are the next live ones, where rows (B * k, ...)
took a flat row index (Add, Reshape), a Reshape of the tokens and an Unsqueeze of the sums; and its sums leave eos's
row out, eos's bar standing for it (Outer.eos_bar), where adding it took two Gathers and an Add. Seven kernels
fewer a step (fold_few_beam's 64 -> 57 after onnxruntime's fusions). The wide graph's decoder reads the same blocks
as 2-D rows (B * k, E) (a Reshape in, one out), its search keeping them as blocks too. The finishing work (new
hypotheses, the n-best merge, the stopping rule: ~55 kernels) runs only after
a step where some input has an eos among its first k candidates, at the last step, or once some input's n-best is
full; at every other step nothing it computes changes (beam_body: in an If each step, or, in fold_few_beam, once
after each run of steps).

The first step runs on one row an input (Outer.first_rows), where the vocabulary holds k candidates: every beam is
bos then, and all but the first start at -inf, so k rows decoded the same row k times (as in CTranslate2, the search
widens to k after step 0; the carried mask holds each step's own slots, step 0's being one). A beam wider than the
vocabulary starts from its k rows, a row's candidates being fewer than k. Timed on an AMD EPYC Zen 4 against k rows
(`loop_graph_ab.py`, dates transformer, beam 5, 12 + 20 tokens): fold_few_beam batch 1 1.0-2.4% faster (T = 1: 214
against 226 us); with the wide graph's search in blocks (four kernels fewer a step), wide_beam 2.5% at batch 16,
4-5% at 64 and 6-8% at 64 eos free.

Inputs: source_ids, source_lengths, max_length, min_length, beam_size, num_hypotheses (int64 scalars) and
length_penalty (float64 scalar). Outputs (batch, num_hypotheses[, max_length]): scores, log_probs (float64), tokens
and lengths (int64); a slot with score -inf holds no hypothesis.
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper

from runtime.optional_graphs import fast_graph_io
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS
from training.tokens.transformer import TransformerSeq2Seq

from . import search
from .attention import AncestryFused, BlockBatched, mask_bias, own_slots
from .beam_body import BLOCK_MASK, STEP_MASK, branched, segmented
from .fold import AncestryFolded, fold_cross
from .int8 import widens
from .kernels import (
    BOOL,
    FLOAT,
    INT32,
    INT64,
    Net,
    cross_kv,
    encoder,
    graph,
    min_length,
)
from .search import DOUBLE, NBEST
from .search import constant as _c


def _no_eos(vocab: int) -> np.ndarray:
    """(V,) float64: -inf at eos, else 0."""
    row = np.zeros(vocab, np.float64)
    row[EOS] = -np.inf
    return row


class Outer:
    """The outer graph's values the body reads: sizes, shapes, the expanded cross-attention and the eos table."""

    def __init__(self, net: Net, model: TransformerSeq2Seq, spec: ModelSpec, wide: bool) -> None:
        self.spec = spec
        self.lengths32 = lengths32 = net.one("Cast", ["source_lengths"], to=INT32)
        cross = cross_kv(net, model, spec, encoder(net, model, spec, "source_ids", lengths32))
        self.batch = net.one("Shape", ["source_lengths"])  # (1,)
        self.k = net.one("Reshape", ["beam_size", _c(net, "one_d", [1])])  # (1,)
        self.h = net.one("Reshape", ["num_hypotheses", _c(net, "one_d", [1])])  # (1,)
        shape_bk = net.one("Concat", [self.batch, self.k], axis=0)
        self.cross = cross  # (B, h, Ls, d) each: an input's beams attend to it as one block
        # Row j of input b reads the cache slots its ancestors wrote: the mask holds each step's slots as it writes
        # them (an identity block per input) and follows the rows when beams are picked.
        self.beam = net.one("Range", [_c(net, "zero", 0), "beam_size", _c(net, "one", 1)])  # (k,)
        self.wide = wide  # the decoder's stream is 2-D rows (B * n, E) (Net.rows); the search's values are blocks
        one_d = _c(net, "one_d", [1])
        vocab = spec.target_vocab_size
        if wide:  # the mask is a bias (0 or -inf) the scores add, (B, 1, n, slots) as the body unsqueezes it
            self.attend = BlockBatched(mask_bias(net, lengths32, cross[0]), STEP_MASK).on_rows(net, spec,
                                                                                              inputs=self.batch)
            self.mask_type = FLOAT
            self.to_blocks = net.one("Concat", [self.batch, _c(net, "rows_v", [-1, vocab])], axis=0)  # [B, -1, V]
        else:  # the mask is the Attention kernel's, (B, n, slots) int32
            self.attend = AncestryFused(lengths32, BLOCK_MASK)
            self.mask_type = INT32
        self.own = self.mask(net, own_slots(net, self.beam))  # (B, k, k)
        # The first step decodes one row an input where the vocabulary holds k candidates (every beam is bos then,
        # and all but the first start at -inf), and the beams' k rows from the second step on.
        self.first_rows = net.one("Where", [net.one("LessOrEqual", ["beam_size", _c(net, "v", vocab)]),
                                            _c(net, "one", 1), "beam_size"])
        self.per_beam = None  # search.select: each beam's best min(2k, V) first, from RANK_PER_BEAM_FROM ids
        if vocab >= search.RANK_PER_BEAM_FROM:  # read as the graph is built (tests lower it)
            self.per_beam = net.one("Min", [net.one("Mul", [self.k, _c(net, "two", [2])]), _c(net, "v", [vocab])])
        self.kv = _c(net, "by_candidate", [0, -1, 1])  # (B, n, m) -> (B, n m, 1): TopK then keeps (B, k, 1)
        if self.per_beam is None:
            self.no_eos = net.weight("no_eos", _no_eos(vocab))  # (V,): added to a step's (B, n, V) sums
        self.shape_bk = shape_bk
        self.k_last = net.one("Sub", [self.k, one_d])  # (1,): the k-th kept candidate's place
        self.last_iter = net.one("Sub", ["max_length", _c(net, "one", 1)])
        steps = net.one("Range", [_c(net, "zero", 0), "max_length", _c(net, "one", 1)])  # (T,)
        self.shape_bht = net.one("Concat", [self.batch, self.h, net.one("Reshape", ["max_length", one_d])], axis=0)
        self.max_pow = net.one("Pow", [net.one("Cast", ["max_length"], to=DOUBLE), "length_penalty"])
        # From every id (not per beam), a step leaves eos's row out of its sums, and search.select reads eos as not
        # among the first k wherever it is blocked (its bar, (T,) float64: -inf there, else 0); search.finish adds
        # the row (float64 then) to the sums it reads.
        bars = self.per_beam is None
        self.min_length = min_length(net, vocab, EOS, steps, np.float64 if bars else np.float32)  # kernels.eos_row
        self.eos_bar = None
        if bars:
            self.eos_bar = net.one("Gather", [_c(net, "bars", [0.0, -np.inf], np.float64), self.min_length.early])
        self.true = _c(net, "true", True, bool)

    def mask(self, net: Net, square: str) -> str:
        """A (n, n) bool block of the slots a row reads -> the mask (B, n, n), one block an input, as the body's
        attention reads it (mask_type)."""
        one_d = _c(net, "one_d", [1])
        blocks = net.one("Tile", [net.one("Unsqueeze", [square, _c(net, "ax0", [0])]),
                                  net.one("Concat", [self.batch, one_d, one_d], axis=0)])
        if self.mask_type == INT32:
            return net.one("Cast", [blocks], to=INT32)
        return net.one("Where", [blocks, _c(net, "zero_f", 0.0, np.float32), _c(net, "minus_inf_f", -np.inf, np.float32)])


def _first(net: Net, o: Outer, spec: ModelSpec) -> tuple[list[str], list[str], list[str]]:
    """The carried values' first values (beam_body): the steps' (STEPS: step 0, then n = Outer.first_rows rows an
    input: bos and live [0, -inf, ...] (B, n, 1), an empty history (B, n, 0), and the mask of step 0's slots (B, n,
    n)), the empty caches, and DONE_NBEST's (no input done, empty n-best, open: none full)."""
    beam = net.one("Range", [_c(net, "zero", 0), o.first_rows, _c(net, "one", 1)])  # (n,)
    first = net.one("Where", [net.one("Equal", [beam, _c(net, "zero", 0)]), _c(net, "zero_d", 0.0, np.float64),
                              _c(net, "minus_inf", -np.inf, np.float64)])  # (n,)
    shape_bn = net.one("Concat", [o.batch, net.one("Shape", [beam])], axis=0)
    live = net.one("Unsqueeze", [net.one("Expand", [first, shape_bn]), _c(net, "ax2", [2])])  # (B, n, 1)
    tokens = net.one("Expand", [_c(net, "bos", [[[BOS]]]), net.one("Shape", [live])])  # (B, n, 1)
    done = net.one("ConstantOfShape", [o.batch], value=helper.make_tensor("f", BOOL, [1], [False]))
    shape_bh = net.one("Concat", [o.batch, o.h], axis=0)
    scores = net.one("Expand", [_c(net, "minus_inf", -np.inf, np.float64), shape_bh])  # (B, H)
    log_probs = net.one("Expand", [_c(net, "zero_d", 0.0, np.float64), shape_bh])
    hyp_tokens = net.one("ConstantOfShape", [o.shape_bht], value=helper.make_tensor("z", INT64, [1], [0]))
    lengths = net.one("Expand", [_c(net, "zero", 0), shape_bh])
    open_ = _c(net, "true", True, bool)
    none = net.one("Concat", [shape_bn, _c(net, "zero_d1", [0])], axis=0)  # no token yet
    history = net.one("ConstantOfShape", [none], value=helper.make_tensor("z", INT64, [1], [0]))
    ancestry = o.mask(net, own_slots(net, beam))  # step 0's n slots, each row its own
    empty = o.attend.empty_cache(net, spec, o.batch)  # one append-only cache per input
    steps = [_c(net, "zero", 0), tokens, live, history, ancestry]
    return steps, empty * spec.layers, [done, scores, log_probs, hyp_tokens, lengths, open_]


def beam_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, wide: bool = False,
               int8: bool = False, fold: bool = False, segments: bool = False) -> onnx.ModelProto:
    """The beam search graph, declared as `optional_graphs.fast_graph_io(spec)["beam"]`; fold: with the cross-attention
    folded (export.tokens.fold), for small calls; segments: its loop in segments (beam_body.segmented:
    fold_few_beam, for calls of runtime.token_steps.FEW_BEAM_INPUTS inputs or fewer), else an If a step
    (beam_body.branched). int8 computes the graphs for few inputs in float32 over its int8 weights where int8.widens
    (Net.widen; dates transformer, beam 5, 20 steps, against int8 arithmetic: folded at batch 1 0.932-0.943x the time,
    loop_graph_ab both ways; plain at 40 tokens, one bare run each, 0.935x at batch 1, 0.956x at 2, 1.03x at 3), and
    runs the wide graph from runtime.token_steps.WIDE_BEAM_INPUTS_INT8 inputs up."""
    from .fast import TYPES, _inputs, _model  # fast.py lists this builder among its graphs

    io = fast_graph_io(spec)["beam"]
    widen = not wide and widens(spec)
    net = Net(skip_norm=False, int8=int8, value_bias=True, widen=widen)  # the one call's caches are its own
    outer = Outer(net, model, spec, wide)
    first = _first(net, outer, spec)

    if fold:
        outer = copy.copy(outer)
        outer.attend = AncestryFolded(outer.lengths32, BLOCK_MASK)
        outer.cross = fold_cross(net, model, spec, outer.cross, outer.lengths32)
    steps, caches, own = first
    body = (segmented if segments else branched)(model, spec, outer, int8, widen=widen)
    outs = net.op("Loop", ["max_length", outer.true, *steps, *caches, *own], len(steps + caches + own), body=body)
    for name, value in zip(NBEST, outs[-len(own) + 1:-1]):
        net.op("Identity", [value], [{"hyp_tokens": "tokens"}.get(name, name)])
    types = {**TYPES, "length_penalty": DOUBLE, "scores": DOUBLE, "log_probs": DOUBLE}
    return _model(graph(net, "fast_beam", _inputs(io["inputs"], types), _inputs(io["outputs"], types), doc))
