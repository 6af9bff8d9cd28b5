"""The transformer written directly in onnxruntime's fused CPU/CUDA kernels (the `com.microsoft` domain): one
`Attention` node per self-attention (Q/K/V projection, attention and the grown cache), one `MultiHeadAttention`
per cross-attention over keys/values the encoder projected once, `SkipLayerNormalization` for every residual add
and the LayerNorm after it, and plain MatMul/Add/Relu for the rest. A decoder step of the 2+2-layer `dates`
transformer is ~34 kernels where the traced graph runs ~120 (Shape/Gather/Unsqueeze/Concat chains for every view).

`Net` collects the nodes and weights; `encoder` and `decoder` append one stack each, reading the model's weights, so
the fast step graph, the greedy and beam loops and the fast encoder all run the same nodes; the decoder's attention
comes in the kinds of `export.tokens.attention` (fused kernels, or batched MatMuls for many rows). What they compute
is the traced graphs' arithmetic (and PyTorch's), checked before anything is written (`export.tokens.fast`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from runtime.spec import ModelSpec
from training.tokens.transformer import Decoder, Encoder, MultiHeadAttention, TransformerSeq2Seq

from . import lift as lifting
from .int8 import int8_columns, widened_linear
from .lift import Lift
from .shift import value_shift
from .stream import MS, start

if TYPE_CHECKING:
    from .attention import Batched, Fused

FLOAT, INT64, INT32, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
LIFTS = True  # Net's default for `lifts` (tests build the same graphs without them)


class Net:
    """Nodes and initializers of a graph under construction; every name gets `prefix`. `skip_norm`: residual adds
    and LayerNorms as one SkipLayerNormalization (fewest nodes; but its CPU kernel costs ~8x Add + Add +
    LayerNormalization from ~64 rows up, so wide graphs write those three). `value_bias`: each attention's output
    bias moves into its values (`value_shift`), for graphs whose caches no other graph reads (the one-call
    graphs: a step graph's state must match the other step graphs'); not with int8 arithmetic
    (DynamicQuantizeMatMul adds a bias at no kernel's cost). `rows`: the decoder's stream is 2-D rows (B', E) (the
    wide loop bodies and the wide step graph), so a projection with a bias is one Gemm (onnxruntime fuses a Relu
    after it), not MatMul + Add. `widen` (with int8): the same int8 weights, but float32 arithmetic: each is stored
    int8 with its column scales and widened by a Cast and a Mul, which onnxruntime folds into a float32 constant
    when it loads the graph; for the graphs of few rows, where quantizing the activations each call costs more than
    int8 products save (onnxruntime 1.32, 1 thread, Intel Xeon: DynamicQuantizeMatMul 1.4-2.9x a float32 Gemm's
    time at 1-5 rows of the dates transformer's projections, 0.57-0.93x at 64-320). `lifts` (default LIFTS): a
    pre-norm stack's norms before the folded cross-attention's scores, each FFN, the cross keys' and values'
    product (the encoder's final norm) and the output layer are lifted, so that those products carry their biases
    (export.tokens.lift: no bias Add); float32 and widened int8 only, not on rows (a Gemm takes its bias there at
    no kernel's cost); the one test of it is lift.lift_in."""

    def __init__(self, prefix: str = "", skip_norm: bool = True, int8: bool = False, value_bias: bool = False,
                 rows: bool = False, widen: bool = False, lifts: bool | None = None) -> None:
        self.prefix, self.skip_norm, self.int8, self.rows = prefix, skip_norm, int8, rows
        self.widen = widen and int8
        self.value_bias = value_bias and (not int8 or self.widen)
        self.lifts = (LIFTS if lifts is None else lifts) and (not int8 or self.widen) and not rows
        self.nodes, self.weights, self._count = [], [], 0
        self._shifts: dict[int, torch.Tensor | None] = {}  # value_shift per output projection, by id

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def weight(self, hint: str, array: np.ndarray | torch.Tensor) -> str:
        """An initializer: torch tensors as float32, numpy arrays in their own dtype."""
        if isinstance(array, torch.Tensor):
            array = array.detach().cpu().float().numpy()
        array = np.asarray(array, order="C")
        name = self.name(hint)
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str | None = None,
           **attrs: object) -> list[str]:
        """Append a node; returns its output names."""
        names = outputs if isinstance(outputs, list) else [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), domain=domain,
                                           **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], domain: str | None = None, **attrs: object) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def matmul(self, x: str, w: torch.Tensor, b: torch.Tensor | None = None) -> str:
        """x (..., in) @ w (in, out) (+ b): MatMul (+ Add); 2-D rows with a bias: one Gemm; int8: one
        DynamicQuantizeMatMul, its bias included; widened int8: the float32 nodes over the widened weights."""
        if not self.int8 or self.widen:
            weight = self.widened(w) if self.widen else self.weight("w", w)
            if self.rows and b is not None:
                return self.one("Gemm", [x, weight, self.weight("b", b)])
            out = self.one("MatMul", [x, weight])
            return out if b is None else self.one("Add", [out, self.weight("b", b)])
        q, scale = int8_columns(w.detach().cpu().numpy())
        inputs = [x, self.weight("w_int8", q), self.weight("w_scale", scale),
                  self.weight("w_zero", np.zeros_like(scale, dtype=np.int8))]
        return self.one("DynamicQuantizeMatMul", inputs + ([self.weight("b", b)] if b is not None else []), MS)

    def widened(self, w: torch.Tensor) -> str:
        """w (in, out) as int8 with one scale per column (int8_columns), widened back to float32 in the graph."""
        q, scale = int8_columns(w.detach().cpu().numpy())
        return self.one("Mul", [self.one("Cast", [self.weight("w_int8", q)], to=FLOAT), self.weight("w_scale", scale)])

    def effective(self, layer: torch.nn.Linear) -> torch.nn.Linear:
        """The layer as this graph multiplies by it: at int8 its int8 weights widened to float32 (as `widened` makes
        them in the graph, and as DynamicQuantizeMatMul scales them), for the products written from weights outside
        `matmul` (the folded cross-attention, made in float32 once a call) and the value shift solved against them;
        else the layer itself."""
        return widened_linear(layer) if self.int8 else layer

    def linear(self, x: str, layer: torch.nn.Linear, bias: bool = True) -> str:
        """x (..., in) -> x W^T (+ b) (..., out)."""
        return self.matmul(x, layer.weight.T, layer.bias if bias else None)

    @property
    def bias_in_matmul(self) -> bool:
        """Whether a sub-layer's output projection takes its bias itself: at int8 (DynamicQuantizeMatMul adds it
        at no kernel's cost; a widened product's own Add costs what the residual's would) or on 2-D rows (Gemm
        does), where no SkipLayerNormalization would take it (else it is one Add more)."""
        return (self.int8 or self.rows) and not self.skip_norm

    def out_projection(self, x: str, layer: torch.nn.Linear) -> str:
        """A sub-layer's output projection before the residual add, its bias in it where `bias_in_matmul`."""
        return self.linear(x, layer, bias=self.bias_in_matmul)

    def attention_out(self, x: str, attention: MultiHeadAttention) -> str:
        """attention's output projection: out_projection, without the bias where its values took it (`shift`)."""
        return self.linear(x, attention.fc_attn, bias=self.bias_in_matmul and self.shift(attention) is None)

    def shift(self, attention: MultiHeadAttention) -> torch.Tensor | None:
        """What this graph adds to attention's value bias so that its output projection needs no bias
        (`value_shift`, solved once per projection), or None: the projection keeps its bias."""
        if not self.value_bias:
            return None
        key = id(attention.fc_attn)
        if key not in self._shifts:
            self._shifts[key] = value_shift(self.effective(attention.fc_attn))
        return self._shifts[key]

    def value_bias_of(self, attention: MultiHeadAttention) -> torch.Tensor:
        """attention's value bias (d_model,), its output bias moved in where `shift` says."""
        shift = self.shift(attention)
        return attention.values.bias if shift is None else attention.values.bias + shift


def qkv(net: Net, attention: MultiHeadAttention, shift: bool = True) -> tuple[str, str]:
    """The merged (E, 3E) Q/K/V weights and (3E,) bias of one attention (shift: the values' bias as
    `net.value_bias_of` gives it; else the model's own)."""
    w = torch.cat([attention.queries.weight, attention.keys.weight, attention.values.weight]).T  # (E, 3E)
    values = net.value_bias_of(attention) if shift else attention.values.bias
    b = torch.cat([attention.queries.bias, attention.keys.bias, values])  # (3E,)
    return net.weight("qkv_w", w), net.weight("qkv_b", b)


def _next_norm(layers: list, i: int, final: torch.nn.Module, pick: str) -> torch.nn.Module:
    """The LayerNorm that reads the stream after layer i's last sub-layer: the next layer's first, or the final."""
    return getattr(layers[i + 1], pick).norm if i + 1 < len(layers) else final


class MinLength(NamedTuple):
    """What keeps eos out below min_length, made once a call: `early` (max_length,) int64, 1 while step t <
    min_length, and `rows` (2, V): row 0 adds nothing, row 1 adds -inf to eos. A step adds `eos_row`'s row."""

    early: str
    rows: str


def min_length(net: Net, vocab_size: int, eos_column: int, steps: str | None = None,
               dtype: type = np.float32) -> MinLength:
    """MinLength for a decode of up to max_length steps (the graph's inputs max_length and min_length; `steps`: the
    graph's (max_length,) range 0 .. max_length - 1, if it has one); eos sits in column `eos_column`. O(max_length)
    a call: a (max_length, V) table read by step would save a kernel a step, but writes max_length x V values every
    call (10 ms at 256 x 32000; 34-46 ms in the one-call graphs, whose sessions run without the arena and so
    take a fresh 33 MB each call). `dtype`: the rows' (the values they are added to)."""
    steps = steps or net.one("Range", [net.weight("zero", np.array(0, np.int64)), "max_length",
                                       net.weight("one", np.array(1, np.int64))])  # (T,)
    rows = np.zeros((2, vocab_size), dtype)
    rows[1, eos_column] = -np.inf
    early = net.one("Cast", [net.one("Less", [steps, "min_length"])], to=INT64)
    return MinLength(early, net.weight("eos_rows", rows))


def eos_row(net: Net, rule: MinLength, t: str) -> str:
    """(V,): what step t (int64 scalar) adds to the log-probs: -inf on eos while t < min_length, else 0."""
    return net.one("Gather", [rule.rows, net.one("Gather", [rule.early, t])])


def position_table(model: TransformerSeq2Seq) -> torch.Tensor:
    """(max_positions, E): the sinusoids, or the learned table."""
    return model.positions.learned.weight if model.positions.learned is not None else model.positions.table


def encoder(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, ids: str, lengths32: str) -> str:
    """ids (B, L) int64 and lengths (B,) int32 -> memory (B, L, E), the final norm's output: lifted where
    `memory_lift` says (cross_kv reads it so), as each layer's norm before its FFN (export.tokens.lift)."""
    layers: list[Encoder] = list(model.encoder_layers)
    pre = spec.norm == "pre"
    table = position_table(model)
    length = net.one("Shape", [ids], start=1, end=2)  # (1,)
    positions = net.one("Slice", [net.weight("positions", table), net.weight("zero", np.array([0], np.int64)),
                                  length, net.weight("axis0", np.array([0], np.int64))])  # (L, E)
    tokens = net.one("Gather", [net.weight("source_embedding", model.source_embedding.weight), ids])  # (B, L, E)
    stream = start(net, pre, tokens, positions, layers[0].res1)
    for i, layer in enumerate(layers):
        # the encoder keeps its output biases: it runs once a call (no Add a step to save), and its memory feeds
        # every cross-attention, where values carrying c moved scores ~5x further from PyTorch's (7.6e-6
        # relative against 1.8e-6 for the dates transformer's first layer)
        w, b = qkv(net, layer.attention, shift=False)
        att = net.one("Attention", [stream.inner, w, b, lengths32], MS, num_heads=spec.n_heads)  # (B, L, E)
        ffn_lift = lifting.lift_in(net, spec, layer.res2.norm)
        stream.add_linear(att, layer.attention.fc_attn, layer.res1, layer.res2.norm, lifted=ffn_lift)
        stream.add_ffn(layer.ffn.linear1, layer.ffn.linear2, layer.res2, _next_norm(layers, i, model.encoder_norm,
                       "res1"), ffn_lift, memory_lift(net, model, spec) if i + 1 == len(layers) else None)
    return stream.inner if pre else stream.x


def memory_lift(net: Net, model: TransformerSeq2Seq, spec: ModelSpec) -> Lift | None:
    """The lift of the encoder's final norm, whose output only cross_kv's product reads, or None."""
    return lifting.lift_in(net, spec, model.encoder_norm)


def cross_kv(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, memory: str) -> list[str]:
    """memory (B, L, E) -> every decoder layer's cross keys and values (B, h, L, d), k0, v0, k1, v1, ... in one
    MatMul for all layers (its bias on the lifted memory where `memory_lift` gives a lift)."""
    layers: list[Decoder] = list(model.decoder_layers)
    w = torch.cat([torch.cat([l.cross_attention.keys.weight, l.cross_attention.values.weight]) for l in layers])
    b = torch.cat([torch.cat([l.cross_attention.keys.bias, net.value_bias_of(l.cross_attention)]) for l in layers])
    kv = lifting.product(net, memory, w.T, b, memory_lift(net, model, spec))  # (B, L, 2 layers E)
    shape = np.array([0, 0, 2 * len(layers) * spec.n_heads, spec.head_dim], np.int64)
    kv = net.one("Reshape", [kv, net.weight("shape", shape)])  # (B, L, 2 layers h, d)
    kv = net.one("Transpose", [kv], perm=[0, 2, 1, 3])  # (B, 2 layers h, L, d)
    sizes = net.weight("sizes", np.full(2 * len(layers), spec.n_heads, np.int64))
    return net.op("Split", [kv, sizes], 2 * len(layers), axis=1)  # (B, h, L, d) each


def decoder(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, tokens: str, positions: str, pasts: list[str],
            cross: list[str], attend: Fused | Batched,
            order: np.ndarray | None = None, chosen_only: bool = True) -> tuple[str, list[str]]:
    """One step: token embeddings (B, 1, E) (a beam graph's blocks: (B, k, E); the wide graphs' 2-D rows: (B, E)),
    position rows (B, 1, E), (B, E) or (1, E), the self-attention caches (`attend.CACHES` per layer, layer by
    layer) and the cross-attention's tensors (`attend.CROSS` per layer: keys and values (B, h, Ls, d), or Folded's)
    -> log-probs (B, 1, V) (blocks: (B, k, V); rows: (B, V)) and the grown caches, in the same order. `order`: the
    ids of the log-prob columns (None: by id). `attend` is any kind of export.tokens.attention or fold, Ancestry
    kinds included. `chosen_only`: the graph reports only the log-probs of the tokens its search picks, so the output
    layer's bias may ride on the lifted final norm too (export.tokens.lift); a step graph, whose every log-prob
    leaves it, keeps that bias: there the never-output ids' -1e4 would carry the rank-one term's
    float32 rounding (3-5e-3 from PyTorch's, where 1e-3 is float32's own step at 1e4)."""
    layers: list[Decoder] = list(model.decoder_layers)
    pre = spec.norm == "pre"
    stream = start(net, pre, tokens, positions, layers[0].res1)
    presents = []
    ffn_lifts = [lifting.lift_in(net, spec, layer.res3.norm) for layer in layers]
    out_lift = lifting.lift_in(net, spec, model.decoder_norm) if chosen_only else None
    for i, layer in enumerate(layers):
        caches = pasts[i * attend.CACHES:(i + 1) * attend.CACHES]
        context, grown = attend.self_attention(net, spec, stream.inner, layer.self_attention, caches)
        presents.extend(grown)
        own = cross[i * attend.CROSS:(i + 1) * attend.CROSS]
        stream.add_attention(context, layer.self_attention, layer.res1, layer.res2.norm,
                             attend.cross_lift(layer.res2.norm, own))
        out = attend.cross_attention(net, spec, stream.inner, layer.cross_attention, own)
        held = attend.CROSS_BIAS or net.bias_in_matmul or net.shift(layer.cross_attention) is not None  # folded
        # into O, out_projection took it, or the values did
        stream.add(out, None if held else layer.cross_attention.fc_attn.bias, layer.res2, layer.res3.norm,
                   ffn_lifts[i])
        stream.add_ffn(layer.ffn.linear1, layer.ffn.linear2, layer.res3, _next_norm(layers, i, model.decoder_norm,
                       "res1"), ffn_lifts[i], out_lift if i + 1 == len(layers) else None)
    out = stream.inner if pre else stream.x  # (B, 1, E)
    weight = model.target_embedding.weight if model.output is None else model.output.weight  # (V, E)
    bias = model.never_output + (0 if model.output is None else model.output.bias)  # (V,): NEVER_LOGIT on <pad>, <s>
    if order is not None:
        weight, bias = weight[torch.as_tensor(order)], bias[torch.as_tensor(order)]
    logits = lifting.product(net, out, weight.T, bias, out_lift)  # (B, 1, V): its bias on the lifted final norm
    return net.one("LogSoftmax", [logits], axis=-1), presents  # (B, 1, V)


def graph(net: Net, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
          doc: str) -> onnx.GraphProto:
    return helper.make_graph(net.nodes, name, inputs, outputs, initializer=net.weights, doc_string=doc)


def tensor(name: str, elem: int, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)

