"""A transformer's fast graphs, built from its weights in onnxruntime's fused kernels (`export.tokens.kernels`):

    fast_encoder.onnx      source_ids, source_lengths -> the first step's state, per layer
    fast_decoder_step.onnx previous_tokens and that state -> log_probs, the state fed back
    fast_greedy.onnx       source_ids, source_lengths, max_length, min_length -> tokens, token_log_probs

The state is per layer, in the layout the kernels read: `past_i` (2, batch, heads, past_len, head_dim), keys then
values, grown by one per step; `cross_keys_i`/`cross_values_i` (batch, heads, source_len, head_dim) and
`memory_lengths` (batch,) int32, which a step only reads; `positions` (batch,). The greedy graph is the encoder and
the greedy loop in one graph (one `run` per batch): the loop carries the last token (batch, 1), which rows emitted
eos, and the caches; it picks the argmax with TopK (ties: the lowest id, as numpy), forbids eos below min_length
and stops once every row emitted eos. After the loop, tokens after a row's eos are 0 and their log-probs 0. The
wide greedy loop caches a layer's keys and values apart (attention.Halves): no other graph reads its cache.

These graphs carry no attention weights: asking for attention decodes with the traced graphs instead.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import onnx
from onnx import helper

from runtime.contract import fast_graph_io
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS, PAD
from training.tokens.transformer import TransformerSeq2Seq

from .attention import Batched, Fused, Halves, mask_bias
from .beam import beam_model
from .kernels import (
    BOOL,
    FLOAT,
    INT32,
    INT64,
    MS,
    Net,
    cross_kv,
    decoder,
    encoder,
    graph,
    position_table,
    tensor,
)

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
    io = fast_graph_io(spec)["step"]
    net = Net(skip_norm=not wide, int8=int8)
    attend = Batched(mask_bias(net, "memory_lengths", "cross_keys_0")) if wide else Fused("memory_lengths")
    axis1 = net.weight("axis1", np.array([1], np.int64))
    tokens = net.one("Gather", [net.weight("target_embedding", model.target_embedding.weight),
                                net.one("Unsqueeze", ["previous_tokens", axis1])])  # (B, 1, E)
    positions = net.one("Gather", [net.weight("positions", position_table(model)),
                                   net.one("Unsqueeze", ["positions", axis1])])  # (B, 1, E)
    pasts = [f"past_{i}" for i in range(spec.layers)]
    cross = [f"cross_{kv}_{i}" for i in range(spec.layers) for kv in ("keys", "values")]
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, cross, attend)
    net.op("Squeeze", [log_probs, axis1], ["log_probs"])  # (B, V)
    net.op("Add", ["positions", net.weight("one", np.array(1, np.int64))], ["next_positions"])
    for i, present in enumerate(presents):
        net.op("Identity", [present], [f"present_{i}"])
    return _model(graph(net, "fast_decoder_step", _inputs(io["inputs"], TYPES),
                        _inputs(io["outputs"], TYPES), doc))


def _penalties(net: Net, spec: ModelSpec) -> str:
    """(max_length, 1, V): row t adds -inf to eos while t < min_length, else 0 (one Gather per step)."""
    eos = np.zeros(spec.target_vocab_size, np.float32)
    eos[EOS] = -np.inf
    index = net.one("Range", [net.weight("zero", np.array(0, np.int64)), "max_length",
                              net.weight("one", np.array(1, np.int64))])  # (T,)
    early = net.one("Unsqueeze", [net.one("Less", [index, "min_length"]),
                                  net.weight("axes", np.array([1, 2], np.int64))])  # (T, 1, 1)
    return net.one("Where", [early, net.weight("eos_penalty", eos), net.weight("no_penalty", np.zeros_like(eos))])


def _body(model: TransformerSeq2Seq, spec: ModelSpec, cross: list[str], penalties: str,
          attend: Fused | Batched, int8: bool) -> onnx.GraphProto:
    """The loop body: (iter, cond, last token (B, 1), finished (B, 1, 1), past_i...) -> (cond, token, finished,
    present_i..., scanned token and log-prob (B, 1, 1))."""
    net = Net("body/", skip_norm=isinstance(attend, Fused), int8=int8)
    table = position_table(model).detach()[:, None, :]  # (P, 1, E): row iter is (1, E), the stream's (S, E) skip
    tokens = net.one("Gather", [net.weight("target_embedding", model.target_embedding.weight), "body/last"])
    positions = net.one("Gather", [net.weight("positions", table), "body/iter"])  # (1, E)
    pasts = [f"body/past_{i}" for i in range(spec.layers * attend.CACHES)]
    log_probs, presents = decoder(net, model, spec, tokens, positions, pasts, cross, attend)
    log_probs = net.one("Add", [log_probs, net.one("Gather", [penalties, "body/iter"])])  # (B, 1, V)
    best_lp, best = net.op("TopK", [log_probs, net.weight("k", np.array([1], np.int64))], 2, axis=-1)  # (B, 1, 1)
    net.op("Squeeze", [best, net.weight("axis2", np.array([2], np.int64))], ["body/next"])  # (B, 1)
    eos = net.one("Equal", [best, net.weight("eos", np.array(EOS, np.int64))])
    net.op("Or", ["body/finished", eos], ["body/finished_out"])
    least = net.one("ReduceMin", [net.one("Cast", ["body/finished_out"], to=FLOAT)], keepdims=0)
    net.op("Less", [least, net.weight("half", np.array(0.5, np.float32))], ["body/cond_out"])  # any row live
    inputs = [tensor("body/iter", INT64, []), tensor("body/cond", BOOL, []), tensor("body/last", INT64, None),
              tensor("body/finished", BOOL, None)] + [tensor(p, FLOAT, None) for p in pasts]
    outputs = [tensor("body/cond_out", BOOL, []), tensor("body/next", INT64, None),
               tensor("body/finished_out", BOOL, None)] + [tensor(p, FLOAT, None) for p in presents]
    outputs += [tensor(best, INT64, None), tensor(best_lp, FLOAT, None)]  # scanned
    return graph(net, "fast_greedy_body", inputs, outputs, "")


def greedy_model(model: TransformerSeq2Seq, spec: ModelSpec, doc: str, wide: bool = False,
                 int8: bool = False) -> onnx.ModelProto:
    io = fast_graph_io(spec)["greedy"]
    net = Net(skip_norm=False, int8=int8)  # the encoder reads batch x source_len rows
    net.op("Cast", ["source_lengths"], ["memory_lengths"], to=INT32)
    memory = encoder(net, model, spec, "source_ids", "memory_lengths")
    cross = cross_kv(net, model, spec, memory)
    attend = Halves(mask_bias(net, "memory_lengths", cross[0])) if wide else Fused("memory_lengths")
    batch = net.one("Shape", ["source_lengths"])  # (1,)
    empty = attend.empty_cache(net, spec, batch)
    column = net.one("Concat", [batch, net.weight("one", np.array([1], np.int64))], axis=0)  # [B, 1]
    first = net.one("Expand", [net.weight("bos", np.array([[BOS]], np.int64)), column])  # (B, 1)
    cube = net.one("Concat", [column, net.weight("one", np.array([1], np.int64))], axis=0)  # [B, 1, 1]
    none = net.one("Expand", [net.weight("false", np.array([[[False]]])), cube])  # (B, 1, 1)
    true = net.weight("true", np.array(True))
    n_out = 2 + spec.layers * attend.CACHES + 2
    outs = net.op("Loop", ["max_length", true, first, none, *empty * spec.layers], n_out,
                  body=_body(model, spec, cross, _penalties(net, spec), attend, int8))
    flat = net.weight("flat", np.array([0, -1], np.int64))  # (T, B, 1, 1) -> (T, B)
    tokens = net.one("Transpose", [net.one("Reshape", [outs[-2], flat])], perm=[1, 0])  # (B, T)
    log_probs = net.one("Transpose", [net.one("Reshape", [outs[-1], flat])], perm=[1, 0])  # (B, T)
    # after a row's first eos: 0 (<pad>) and log-prob 0, as the traced loop graph gives
    is_eos = net.one("Cast", [net.one("Equal", [tokens, net.weight("eos", np.array(EOS, np.int64))])], to=INT64)
    seen = net.one("CumSum", [is_eos, net.weight("axis", np.array(1, np.int64))])  # eos up to and including t
    after = net.one("Greater", [net.one("Sub", [seen, is_eos]), net.weight("zero", np.array(0, np.int64))])
    net.op("Where", [after, net.weight("pad", np.array(PAD, np.int64)), tokens], ["tokens"])
    net.op("Where", [after, net.weight("zero_f", np.array(0.0, np.float32)), log_probs], ["token_log_probs"])
    return _model(graph(net, "fast_greedy", _inputs(io["inputs"], TYPES),
                        _inputs(io["outputs"], TYPES), doc))


FAST_BUILDERS = {"encoder": encoder_model, "step": step_model, "greedy": greedy_model,  # by FAST_FILES role
                 "beam": beam_model, "wide_step": partial(step_model, wide=True),
                 "wide_greedy": partial(greedy_model, wide=True), "wide_beam": partial(beam_model, wide=True)}
