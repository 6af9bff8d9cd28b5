"""A transformer's fast graphs, built from its weights in onnxruntime's fused kernels (`export.tokens.kernels`):

    fast_encoder.onnx      source_ids, source_lengths -> the first step's state, per layer
    fast_decoder_step.onnx previous_tokens and that state -> log_probs, the state fed back
    fast_greedy.onnx       source_ids, source_lengths, max_length, min_length -> tokens, token_log_probs

The state is per layer, in the layout the kernels read: `past_i` (2, batch, heads, past_len, head_dim), keys then
values, grown by one per step; `cross_keys_i`/`cross_values_i` (batch, heads, source_len, head_dim) and
`memory_lengths` (batch,) int32, which a step only reads; `positions` (batch,). The greedy graph is the encoder and
the greedy loop in one graph (one `run` per batch): the loop carries the last token (batch, 1, 1), which rows are
still live, and the caches; it picks the argmax with TopK (ties: the lowest id, as numpy), forbids eos below
min_length and stops once every row emitted eos. Inside the loop the log-prob columns are in `eos_first` order, so
a row is live while its every index was above 0 (one Min a step). After the loop, the indices become ids, and
tokens after a row's eos are 0 and their log-probs 0. The wide greedy loop reads G inputs as one block
(attention.BlockBatched): no other graph reads its cache. fold_greedy.onnx and fold_beam.onnx (fold_few_beam.onnx:
its loop in segments, export.tokens.beam_body) run a folded cross-attention, for small calls (export.tokens.fold).

These graphs carry no attention weights: asking for attention decodes with the traced graphs instead.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import torch
from onnx import helper

from runtime.optional_graphs import fast_graph_io
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS, PAD
from training.tokens.transformer import TransformerSeq2Seq

from .attention import Batched, BlockBatched, Fused, mask_bias, own_slots
from .beam import beam_model
from .fold import Folded, fold_cross
from .int8 import widens
from .kernels import (
    BOOL,
    FLOAT,
    INT32,
    INT64,
    MS,
    MinLength,
    Net,
    cross_kv,
    decoder,
    encoder,
    eos_row,
    graph,
    min_length,
    position_table,
    tensor,
)

GROUP = 4  # inputs per block in the wide greedy loop (dates transformer, batch 64: attention 0.67x at 4, 0.71x at 8)
# ... where source_len + max_length is at most this; longer decodes read one input a block, as each block's queries
# read G times the keys (dates transformer, batch 64, 4 inputs a block, against the loop before blocks: 0.83x its
# time at 13 + 20, 0.91-0.95x at 30 + 30, level at 50 + 50, 1.03-1.07x at 100 + 20, 1.21-1.27x at 100 + 100; one
# input a block costs 1.00-1.13x, its transposes and bias adds).
BLOCKS_UP_TO = 100
STEP_BIAS = "body/step_bias"  # the wide greedy body's self-attention bias at this step, (G, G t)
ONNX_OPSET = 17  # TopK, Split (num_outputs needs 18: below, Split takes explicit sizes), Shape start/end
MS_OPSET = 1


def _inputs(io: dict, types: dict[str, int]) -> list[onnx.ValueInfoProto]:
    """Typed value infos of declared inputs or outputs: `types`, float32 for the rest."""
    return [tensor(name, types.get(name, FLOAT), dims) for name, dims in io.items()]


INTS = ("source_ids", "source_lengths", "previous_tokens", "positions", "next_positions", "max_length", "min_length",
        "tokens", "beam_size", "num_hypotheses", "lengths")
# Element types of the fast graphs' inputs and outputs; the rest are float32.
TYPES = {**{n: INT64 for n in INTS}, "memory_lengths": INT32}


def _model(g: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", ONNX_OPSET),
                                                helper.make_opsetid(MS, MS_OPSET)])
    model.ir_version = 8
    return model


def _first_state(net: Net, spec: ModelSpec, lengths: str) -> list[str]:
    """positions 0 (B,) and an empty cache (2, B, h, 0, d) per layer, shaped from lengths (B,)."""
    batch = net.one("Shape", [lengths])  # (1,)
    positions = net.one("ConstantOfShape", [batch], value=helper.make_tensor("z", INT64, [1], [0]))
    return [positions, *Fused.empty_cache(net, spec, batch)]


def encoder_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, int8: bool = False) -> onnx.ModelProto:
    io = fast_graph_io(spec)["encoder"]
    net = Net(skip_norm=False, int8=int8)  # it reads every source token: batch x source_len rows
    lengths32 = net.one("Cast", ["source_lengths"], to=INT32)
    memory = encoder(net, model, spec, "source_ids", lengths32)
    cross = cross_kv(net, model, spec, memory)
    positions, empty = _first_state(net, spec, "source_lengths")
    produced = {"memory_lengths": lengths32, "positions": positions}
    for i in range(spec.layers):
        produced.update({f"past_{i}": empty, f"cross_keys_{i}": cross[2 * i], f"cross_values_{i}": cross[2 * i + 1]})
    for name in io["outputs"]:  # graph outputs under their declared names
        net.op("Identity", [produced[name]], [name])
    return _model(graph(net, "fast_encoder", _inputs(io["inputs"], TYPES),
                        _inputs(io["outputs"], TYPES), doc))


def step_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, wide: bool = False,
               int8: bool = False) -> onnx.ModelProto:
    """One decoder step over the state the fast encoder makes; wide: attention in batched MatMuls (from WIDE_ROWS
    rows) and the rows as one 2-D (B, E) matrix, so each projection with a bias is one Gemm (Net.rows)."""
    io = fast_graph_io(spec)["step"]
    net = Net(skip_norm=not wide, int8=int8, rows=wide,
              widen=not wide and widens(spec))  # int8: widened below WIDE_ROWS rows (int8.widens)
    attend = Batched(mask_bias(net, "memory_lengths", "cross_keys_0")) if wide else Fused("memory_lengths")
    axis1 = None if wide else net.weight("axis1", np.array([1], np.int64))

    def rows(name: str) -> str:  # (B,) as it comes for (B, E) rows, else (B, 1)
        return name if wide else net.one("Unsqueeze", [name, axis1])
    tokens = net.one("Gather", [net.weight("target_embedding", model.target_embedding.weight),
                                rows("previous_tokens")])  # (B, [1,] E)
    positions = net.one("Gather", [net.weight("positions", position_table(model)), rows("positions")])
    pasts = [f"past_{i}" for i in range(spec.layers)]
    cross = [f"cross_{kv}_{i}" for i in range(spec.layers) for kv in ("keys", "values")]
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, cross, attend, chosen_only=False)
    if wide:
        net.op("Identity", [log_probs], ["log_probs"])  # (B, V)
    else:
        net.op("Squeeze", [log_probs, axis1], ["log_probs"])  # (B, V)
    net.op("Add", ["positions", net.weight("one", np.array(1, np.int64))], ["next_positions"])
    for i, present in enumerate(presents):
        net.op("Identity", [present], [f"present_{i}"])
    return _model(graph(net, "fast_decoder_step", _inputs(io["inputs"], TYPES),
                        _inputs(io["outputs"], TYPES), doc))


def eos_first(vocab_size: int) -> np.ndarray:
    """The greedy loop's column order: (V,) ids, eos first, then every other id in id order. A row has emitted eos
    once its index was 0, so the stop test is Min, ReduceMax and Cast (Equal, Or, Cast, ReduceMin and Less before:
    fast_greedy batch 1 0.984-0.992x the time, 0.980x free, one session a side; timed again with six, it and the
    Add + LayerNormalization bodies together bought 1.4-1.8% at batch 1 and 5% at batch 4). TopK's ties still go to
    the lowest id: among the ids after eos the order is unchanged, and the ids it moves ahead of (<pad>, <s>) are
    never emitted (NEVER_LOGIT)."""
    return np.array([EOS] + [i for i in range(vocab_size) if i != EOS], np.int64)


def _body(model: TransformerSeq2Seq, spec: ModelSpec, cross: list[str], rule: MinLength,
          attend: Fused | Batched, int8: bool, own: str | None = None, widen: bool = False) -> onnx.GraphProto:
    """The loop body: (iter, cond, last token (B, 1, 1), live (B, 1, 1), [bias (G, G t),] past_i...) -> (cond,
    token, live, [bias,] present_i..., scanned token and log-prob (B, 1, 1)). Tokens are indices in `eos_first`
    order: the token is TopK's index as it comes, read back by GatherND (no Squeeze a step) from the embedding rows
    in that order, and `live` (int64) is 1 until a row's index is 0 (eos). Blocked (`own`: the (G, G) bias of a
    block's own slots), the carried self-attention bias grows by `own` each step, and the stream is 2-D rows (B' =
    B/G x G, E; Net.rows: projections as Gemm), a block being G consecutive rows: last, live and the scans (B', 1)."""
    # Residuals as Add + LayerNormalization, not SkipLayerNormalization: though more kernels, onnxruntime 1.32's CPU
    # SkipLayerNormalization is the slower (fast_greedy 0.96-0.98x the time at batch 1, 0.94x at 4, int8 0.95x, one
    # session a side; see eos_first for the figures with six)
    net = Net("body/", skip_norm=False, int8=int8, value_bias=True, rows=own is not None,
              widen=widen)  # caches: its own
    order = eos_first(spec.target_vocab_size)
    table = position_table(model).detach()[:, None, :]  # (P, 1, E): row iter is (1, E), added to the (B, 1, E) rows
    embedding = model.target_embedding.weight[torch.as_tensor(order)]  # row i: the id at index i
    tokens = net.one("GatherND", [net.weight("target_embedding", embedding),
                                  "body/last"])  # (B, 1, E): the index's last axis (1) picks a row
    positions = net.one("Gather", [net.weight("positions", table), "body/iter"])  # (1, E)
    pasts = [f"body/past_{i}" for i in range(spec.layers * attend.CACHES)]
    carried = [] if own is None else [tensor("body/bias", FLOAT, None)]
    if own is not None:
        net.op("Concat", ["body/bias", own], [STEP_BIAS], axis=1)  # (G, G t): row j reads slots s G + j
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, cross, attend, order)
    log_probs = net.one("Add", [log_probs, eos_row(net, rule, "body/iter")])  # (B, 1, V)
    best_lp, best = net.op("TopK", [log_probs, net.weight("k", np.array([1], np.int64))], 2, axis=-1)  # (B, 1, 1)
    net.op("Min", ["body/live", best], ["body/live_out"])  # 0 from a row's eos (index 0) on
    net.op("Cast", [net.one("ReduceMax", ["body/live_out"], keepdims=0)], ["body/cond_out"], to=BOOL)  # any live
    inputs = [tensor("body/iter", INT64, []), tensor("body/cond", BOOL, []), tensor("body/last", INT64, None),
              tensor("body/live", INT64, None), *carried] + [tensor(p, FLOAT, None) for p in pasts]
    outputs = [tensor("body/cond_out", BOOL, []), tensor(best, INT64, None),
               tensor("body/live_out", INT64, None)]
    outputs += [tensor(STEP_BIAS, FLOAT, None)] * len(carried) + [tensor(p, FLOAT, None) for p in presents]
    outputs += [tensor(best, INT64, None), tensor(best_lp, FLOAT, None)]  # scanned
    return graph(net, "fast_greedy_body", inputs, outputs, "")


def greedy_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, wide: bool = False,
                 int8: bool = False, fold: bool = False) -> onnx.ModelProto:
    """The greedy graph; wide: in blocks of GROUP inputs (`_blocked`); fold: with the cross-attention folded. int8: the
    graphs for fewer than WIDE_GREEDY_INPUTS inputs compute in float32 over the int8 weights where int8.widens
    (Net.widen; dates transformer, 20 steps, loop_graph_ab both ways, against int8 arithmetic: folded at batch 1
    0.835-0.871x the time, not folded at 29 tokens 0.831-0.848x, batch 4 0.912-0.917x with the value shift)."""
    io = fast_graph_io(spec)["greedy"]
    net = Net(skip_norm=False, int8=int8, value_bias=True,
              widen=not wide and widens(spec))  # the encoder: batch x source_len rows
    if wide:
        tokens, log_probs = _blocked(net, model, spec, int8)
    else:
        net.op("Cast", ["source_lengths"], ["memory_lengths"], to=INT32)
        memory = encoder(net, model, spec, "source_ids", "memory_lengths")
        attend, cross = Fused("memory_lengths"), cross_kv(net, model, spec, memory)
        batch = net.one("Shape", ["source_lengths"])  # (1,)
        column = net.one("Concat", [batch, net.weight("one", np.array([1], np.int64))], axis=0)  # [B, 1]
        cube = net.one("Concat", [column, net.weight("one", np.array([1], np.int64))], axis=0)  # [B, 1, 1]
        first = net.one("Expand", [net.weight("bos", np.array([[[_index(spec, BOS)]]], np.int64)), cube])
        live = net.one("Expand", [net.weight("live", np.array([[[1]]], np.int64)), cube])  # (B, 1, 1) each
        inputs = ["max_length", net.weight("true", np.array(True)), first, live,
                  *attend.empty_cache(net, spec, batch) * spec.layers]
        rule, count = min_length(net, spec.target_vocab_size, 0), 2 + spec.layers + 2  # eos_first: eos is 0
        if fold:
            cross, attend = fold_cross(net, model, spec, cross, "memory_lengths"), Folded("memory_lengths")
        scans = net.op("Loop", inputs, count, body=_body(model, spec, cross, rule, attend, int8,
                                                         widen=net.widen))[-2:]
        tokens, log_probs = (_time_last(net, scan) for scan in scans)
    tokens = net.one("Gather", [net.weight("ids", eos_first(spec.target_vocab_size)), tokens])  # indices -> ids
    # after a row's first eos: 0 (<pad>) and log-prob 0, as the traced loop graph gives
    is_eos = net.one("Cast", [net.one("Equal", [tokens, net.weight("eos", np.array(EOS, np.int64))])], to=INT64)
    seen = net.one("CumSum", [is_eos, net.weight("axis", np.array(1, np.int64))])  # eos up to and including t
    after = net.one("Greater", [net.one("Sub", [seen, is_eos]), net.weight("zero", np.array(0, np.int64))])
    net.op("Where", [after, net.weight("pad", np.array(PAD, np.int64)), tokens], ["tokens"])
    net.op("Where", [after, net.weight("zero_f", np.array(0.0, np.float32)), log_probs], ["token_log_probs"])
    return _model(graph(net, "fast_greedy", _inputs(io["inputs"], TYPES),
                        _inputs(io["outputs"], TYPES), doc))


def _index(spec: ModelSpec, token: int) -> int:
    """A token id's index in the greedy loop's eos_first order."""
    return int(np.flatnonzero(eos_first(spec.target_vocab_size) == token)[0])


def _time_last(net: Net, scan: str) -> str:
    """A scan output (T, rows...) -> (B, T): one row per input, in order."""
    flat = net.one("Reshape", [scan, net.weight("flat", np.array([0, -1], np.int64))])  # (T, B)
    return net.one("Transpose", [flat], perm=[1, 0])


def _blocked(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, int8: bool) -> tuple[str, str]:
    """The wide greedy loop over blocks of G inputs, G consecutive rows of the body's (B, E) stream (the batch
    padded to a multiple of G with inputs that count as ended from the start): each block attends as one, its G
    queries to the G inputs' cross-attention keys/values side by side (B/G, h, G Ls, d) and to one self-attention
    cache where step t writes slots G t .. G t + G - 1, each query through a bias (0 on its own input's keys and
    slots, -inf elsewhere): G times fewer (input, head) products for the batched MatMuls (attention.BlockBatched),
    each reading G times the keys. G is GROUP where source_len + max_length <= BLOCKS_UP_TO, else 1 (one input a
    block: the per-input products). -> tokens and log-probs (B, T)."""
    h, d = spec.n_heads, spec.head_dim
    c = {name: net.weight(name, np.array(value, np.int64)) for name, value in
         (("zero", [0]), ("zeros", [0, 0]), ("one", [1]), ("minus_one", [-1]), ("h", [h]), ("d", [d]))}
    short = net.one("LessOrEqual", [net.one("Add", [net.one("Shape", ["source_ids"], start=1, end=2),
                                                    net.one("Reshape", ["max_length", c["one"]])]),
                                    net.weight("up_to", np.array([BLOCKS_UP_TO], np.int64))])
    g = net.one("Where", [short, net.weight("group", np.array([GROUP], np.int64)), c["one"]])  # (1,): G
    batch = net.one("Shape", ["source_lengths"])  # (1,)
    padded = net.one("Mul", [net.one("Div", [net.one("Add", [batch, net.one("Sub", [g, c["one"]])]), g]), g])
    extra = net.one("Sub", [padded, batch])  # (1,): 0 .. G - 1 inputs that only fill the last block
    ids = net.one("Pad", ["source_ids", net.one("Concat", [c["zeros"], extra, c["zero"]], axis=0),
                          net.weight("pad_id", np.array(PAD, np.int64))])  # (B', L)
    lengths32 = net.one("Cast", [net.one("Pad", ["source_lengths", net.one("Concat", [c["zero"], extra], axis=0),
                                                  net.weight("one_token", np.array(1, np.int64))])], to=INT32)
    cross = cross_kv(net, model, spec, encoder(net, model, spec, ids, lengths32))  # (B', h, Ls, d) each
    length = net.one("Shape", [cross[0]], start=2, end=3)  # (1,): Ls
    block_keys = net.one("Concat", [net.weight("block_keys", np.array([-1, 1, 1], np.int64)),
                                    net.one("Mul", [length, g])], axis=0)  # [B'/G, 1, 1, G Ls]
    padding = net.one("Reshape", [mask_bias(net, lengths32, cross[0]), block_keys])  # 0 / -inf per input's keys
    by_input = net.one("Concat", [c["minus_one"], g, c["h"], length, c["d"]], axis=0)  # [B'/G, G, h, Ls, d]
    side_by_side = net.weight("side_by_side", np.array([0, 0, -1, d], np.int64))  # -> (B'/G, h, G Ls, d)
    cross = [net.one("Reshape", [net.one("Transpose", [net.one("Reshape", [kv, by_input])], perm=[0, 2, 1, 3, 4]),
                                 side_by_side]) for kv in cross]
    steps = (net.weight("zero_s", np.array(0, np.int64)), net.weight("one_s", np.array(1, np.int64)))
    index = net.one("Range", [steps[0], net.one("Squeeze", [g]), steps[1]])  # (G,)
    own = net.one("Where", [own_slots(net, index), net.weight("zero_f", np.array(0.0, np.float32)),
                            net.weight("minus_inf", np.array(-np.inf, np.float32))])  # (G, G): query j reads input j
    own_keys = net.one("Reshape", [net.one("Expand", [net.one("Unsqueeze", [own, net.weight("two", np.array(
        [2], np.int64))]), net.one("Concat", [g, g, length], axis=0)]), net.one("Concat", [g, c["minus_one"]],
                                                                                 axis=0)])  # (G, G Ls)
    attend = BlockBatched(net.one("Add", [padding, own_keys]), STEP_BIAS)  # bias (B'/G, 1, G, G Ls)
    attend.on_rows(net, spec, g)  # the body's stream: (B', E)
    blocks = net.one("Div", [padded, g])  # (1,)
    rows = net.one("Range", [steps[0], net.one("Squeeze", [padded]), steps[1]])  # (B',)
    column = net.weight("column", np.array([-1, 1], np.int64))
    live = net.one("Cast", [net.one("Reshape", [net.one("Less", [rows, batch]), column])],
                   to=INT64)  # (B', 1): 0 on the padding inputs
    first = net.one("Expand", [net.weight("bos", np.array([[_index(spec, BOS)]], np.int64)),
                               net.one("Concat", [padded, c["one"]], axis=0)])  # (B', 1)
    no_slot = net.one("ConstantOfShape", [net.one("Concat", [g, c["zero"]], axis=0)],
                      value=helper.make_tensor("z", FLOAT, [1], [0.0]))  # (G, 0)
    outs = net.op("Loop", ["max_length", net.weight("true", np.array(True)), first, live, no_slot,
                           *attend.empty_cache(net, spec, blocks) * spec.layers], 3 + 2 * spec.layers + 2,
                  body=_body(model, spec, cross, min_length(net, spec.target_vocab_size, 0), attend, int8,
                              own))
    return tuple(net.one("Slice", [_time_last(net, scan), c["zero"], batch, c["zero"]]) for scan in outs[-2:])


FAST_BUILDERS = {"encoder": encoder_model, "step": step_model, "greedy": greedy_model,  # by FAST_FILES role
                 "beam": beam_model, "wide_step": partial(step_model, wide=True),
                 "wide_greedy": partial(greedy_model, wide=True), "wide_beam": partial(beam_model, wide=True),
                 "fold_greedy": partial(greedy_model, fold=True), "fold_beam": partial(beam_model, fold=True),
                 "fold_few_beam": partial(beam_model, fold=True, segments=True)}
