"""Attention for one decoder step, in kinds over the same state (`export.tokens.kernels.decoder` takes any):
onnxruntime's fused kernels (Fused: fewest nodes, best for few rows) and batched MatMuls (Batched: faster from
`runtime.token_steps.WIDE_ROWS` rows up). The loop graphs read rows in blocks: in the beam graphs (`export.tokens.beam`;
AncestryFused, BlockBatched) an input's k beams are one (k, E) block that reads the input's one copy of the
cross-attention keys/values, and its own append-only self-attention cache through a mask of the slots the beam's
ancestors wrote, so picking beams reorders the mask, never the cache; the wide greedy loop (BlockBatched) puts G
inputs side by side in a block the same way. For small calls the one-call graphs fold the cross-attention into
per-input matrices made once (`export.tokens.fold`).

A kind says how its self-attention cache looks (CACHES tensors per layer, and `empty_cache` makes a layer's before
the first step) and how many cross-attention tensors a layer reads (CROSS)."""
from __future__ import annotations

import numpy as np
import torch
from onnx import helper

from runtime.spec import ModelSpec
from training.tokens.transformer import MultiHeadAttention

from .kernels import FLOAT, INT32, MS, Net, qkv
from .lift import Lift


class Fused:
    """Attention in onnxruntime's own kernels: fewest nodes (best at small batch), but the CPU kernels loop over
    (row, head) pairs, so they cost ~2 us per pair (285 us for 64 rows x 4 heads)."""

    CACHES = 1  # one cache per layer, (2, rows, h, t, d): keys then values (the state's past_i)
    CROSS = 2  # cross-attention tensors per layer: keys, values (B, h, Ls, d) (kernels.cross_kv)
    CROSS_BIAS = False  # whether cross_attention's output always holds fc_attn's bias (else: net.bias_in_matmul)

    def __init__(self, lengths32: str) -> None:
        self.lengths32 = lengths32  # (B,) int32: the cross-attention reads keys 0 .. length - 1

    @staticmethod
    def cross_lift(norm: torch.nn.Module, cross: list[str]) -> Lift | None:
        """The lift (export.tokens.lift) the cross-attention's input must carry: none here (fold.Folded's may)."""
        return None

    @staticmethod
    def empty_cache(net: Net, spec: ModelSpec, rows: str) -> list[str]:
        """A layer's cache before the first step, for `rows` (1,) rows."""
        return [_no_steps(net, spec, 2, rows)]

    def self_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                       past: list[str]) -> tuple[str, list[str]]:
        """x (B, 1, E), past [(2, B, h, t, d)] -> context (B, 1, E) before fc_attn, [present (2, B, h, t + 1, d)]."""
        w, b = qkv(net, attention)
        context, present = net.op("Attention", [x, w, b, "", *past], 2, MS, num_heads=spec.n_heads)
        return context, [present]

    def cross_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                        cross: list[str]) -> str:
        """x (B, 1, E), cross [keys, values (B, h, Ls, d)] -> fc_attn(context) (B, 1, E), less its bias unless
        `net.bias_in_matmul` (and the values did not take it: `net.shift`)."""
        keys, values = cross
        queries = attention.queries
        query = net.linear(x, queries, bias=False)  # (B, 1, E); the kernel adds the bias
        bias = torch.cat([queries.bias, torch.zeros(2 * queries.bias.numel())])  # (3E,): keys, values projected
        context = net.one("MultiHeadAttention", [query, keys, values, net.weight("q_b", bias), self.lengths32], MS,
                          num_heads=spec.n_heads)
        return net.attention_out(context, attention)


class Batched:
    """Attention in batched MatMuls over (row, head) (CTranslate2's layout for one query token: splitting heads
    is a reshape, no transpose): more nodes, but 2-3x faster than the fused kernels from ~16 rows up."""

    CACHES, CROSS, CROSS_BIAS = Fused.CACHES, Fused.CROSS, Fused.CROSS_BIAS
    empty_cache, cross_lift = Fused.empty_cache, staticmethod(Fused.cross_lift)

    def __init__(self, mask_bias: str) -> None:
        self.mask_bias = mask_bias  # (B, 1, 1, Ls): 0 where a source token is read, -inf on padding

    def self_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                       past: list[str]) -> tuple[str, list[str]]:
        h, d = spec.n_heads, spec.head_dim
        w, b = _scaled_qkv(net, attention, d)
        projected = net.matmul(x, w, b)  # (B, 1, 3E), or (B, 3E) on rows (net.rows)
        split = net.one("Reshape", [projected, net.weight("shape", np.array([0, 3, h, 1, d], np.int64))])
        split = net.one("Transpose", [split], perm=[1, 0, 2, 3, 4])  # (3, B, h, 1, d): q, k, v
        query, new = net.op("Split", [split, net.weight("sizes", np.array([1, 2], np.int64))], 2, axis=0)
        present = net.one("Concat", [*past, new], axis=3)  # (2, B, h, t + 1, d)
        keys, values = net.op("Split", [present, net.weight("halves", np.array([1, 1], np.int64))], 2, axis=0)
        weights = net.one("Softmax", [net.one("MatMul", [query, net.one("Transpose", [keys], perm=[0, 1, 2, 4, 3])])],
                          axis=-1)  # (1, B, h, 1, t + 1)
        context = net.one("MatMul", [weights, values])  # (1, B, h, 1, d)
        return net.one("Reshape", [context, net.weight("rows", np.array(_merged(net, h * d), np.int64))]), [present]

    def cross_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                        cross: list[str]) -> str:
        keys, values = cross
        h, d = spec.n_heads, spec.head_dim
        scale = 1.0 / np.sqrt(d)
        query = net.matmul(x, attention.queries.weight.T * scale, attention.queries.bias * scale)  # (B, 1, E)
        query = net.one("Reshape", [query, net.weight("heads", np.array([0, h, 1, d], np.int64))])  # (B, h, 1, d)
        scores = net.one("MatMul", [query, net.one("Transpose", [keys], perm=[0, 1, 3, 2])])  # (B, h, 1, Ls)
        weights = net.one("Softmax", [net.one("Add", [scores, self.mask_bias])], axis=-1)
        context = net.one("MatMul", [weights, values])  # (B, h, 1, d)
        context = net.one("Reshape", [context, net.weight("rows", np.array(_merged(net, h * d), np.int64))])
        return net.attention_out(context, attention)


class AncestryFused(Fused):
    """Fused, for the beam graph, where the decoder's rows are blocks (B, k, E): an input's k beams attend as one
    block, to its one copy of the cross-attention keys/values and to its own self-attention cache, which is
    append-only, (2, B, h, slots, d) (a step's k keys after the slots before it; step 0 writes one where the beam
    graph starts from one row an input), and never reordered when beams are picked: `mask` (B, k, slots) int32,
    this step's slots included, which the beam graph grows and reorders each step, lets a beam read only the
    slots its ancestors wrote. k times fewer (row, head) pairs for the kernels (CTranslate2's layout), and no cache
    Gather. `mask`: the name the body gives that step's mask."""

    def __init__(self, lengths32: str, mask: str) -> None:
        super().__init__(lengths32)
        self.mask = mask

    def self_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                       past: list[str]) -> tuple[str, list[str]]:
        """x (B, k, E), past [(2, B, h, k t, d)] -> context (B, k, E) before fc_attn, [(2, B, h, k t + k, d)]."""
        w, b = qkv(net, attention)
        context, present = net.op("Attention", [x, w, b, self.mask, *past], 2, MS, num_heads=spec.n_heads)
        return context, [present]


class BlockBatched(Batched):
    """Batched attention over blocks of k queries (B, k, E), each block one batch entry for the MatMuls: the wide
    beam graph's (an input's k beams, with AncestryFused's append-only cache) and the wide greedy loop's (k
    inputs side by side). Keys and values are cached apart, (1, B, h, k t, d) each, one Concat per half a step;
    `bias` (broadcast to (B, 1, k, k t)) is 0 on the slots a query reads and -inf elsewhere, and `mask_bias`
    (B, 1, k or 1, keys) masks the cross-attention's keys."""

    CACHES = 2

    def __init__(self, mask_bias: str, bias: str) -> None:
        super().__init__(mask_bias)
        self.bias = bias
        self.qkv_shape = self.heads_shape = ""  # (B, k, E) blocks; `on_rows`: k consecutive rows of (B k, E)

    def on_rows(self, net: Net, spec: ModelSpec, k: str = "", inputs: str = "") -> BlockBatched:
        """Read the stream as 2-D rows (B k, E), a block being k (1,) consecutive rows, or the rows split into
        `inputs` (1,) blocks of equal size (the wide loop bodies, whose projections are then Gemms: Net.rows): the
        shapes that split rows into blocks are made once, in `net` (the graph around the loop)."""
        h, d = spec.n_heads, spec.head_dim
        minus_one = net.weight("minus_one", np.array([-1], np.int64))
        lead = [minus_one, k] if k else [inputs, minus_one]
        self.qkv_shape = net.one("Concat", [*lead, net.weight("qhd", np.array([3, h, d], np.int64))], axis=0)
        self.heads_shape = net.one("Concat", [*lead, net.weight("hd", np.array([h, d], np.int64))], axis=0)
        return self

    @staticmethod
    def empty_cache(net: Net, spec: ModelSpec, rows: str) -> list[str]:
        """(1, B, h, 0, d) keys and values for `rows` (1,) blocks."""
        return [_no_steps(net, spec, 1, rows)] * 2

    def self_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                       past: list[str]) -> tuple[str, list[str]]:
        """x (B, k, E), past [keys, values (1, B, h, k t, d)] -> context (B, k, E) before fc_attn, [keys, values
        (1, B, h, k t + k, d)]."""
        h, d = spec.n_heads, spec.head_dim
        w, b = _scaled_qkv(net, attention, d)
        shape = self.qkv_shape or net.weight("qkv", np.array([0, 0, 3, h, d], np.int64))
        split = net.one("Reshape", [net.matmul(x, w, b), shape])  # (B, k, 3, h, d)
        split = net.one("Transpose", [split], perm=[2, 0, 3, 1, 4])  # (3, B, h, k, d)
        query, key, value = net.op("Split", [split, net.weight("thirds", np.array([1, 1, 1], np.int64))], 3, axis=0)
        keys, values = (net.one("Concat", [old, new], axis=3) for old, new in zip(past, (key, value)))
        scores = net.one("Add", [net.one("FusedMatMul", [query, keys], MS, transB=1), self.bias])  # (1, B, h, k, kt)
        context = net.one("MatMul", [net.one("Softmax", [scores], axis=-1), values])  # (1, B, h, k, d)
        context = net.one("Transpose", [context], perm=[1, 3, 0, 2, 4])  # (B, k, 1, h, d)
        return _merge_heads(net, spec, context), [keys, values]

    def cross_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                        cross: list[str]) -> str:
        """x (B, k, E), cross [keys, values (B, h, Ls, d)] -> fc_attn(context) (B, k, E), less its bias unless
        `net.bias_in_matmul` (and the values did not take it: `net.shift`)."""
        keys, values = cross
        h, d = spec.n_heads, spec.head_dim
        scale = 1.0 / np.sqrt(d)
        query = net.matmul(x, attention.queries.weight.T * scale, attention.queries.bias * scale)  # (B, k, E)
        shape = self.heads_shape or net.weight("heads", np.array([0, 0, h, d], np.int64))
        query = net.one("Transpose", [net.one("Reshape", [query, shape])], perm=[0, 2, 1, 3])  # (B, h, k, d)
        scores = net.one("FusedMatMul", [query, keys], MS, transB=1)  # (B, h, k, Ls)
        weights = net.one("Softmax", [net.one("Add", [scores, self.mask_bias])], axis=-1)
        context = net.one("Transpose", [net.one("MatMul", [weights, values])], perm=[0, 2, 1, 3])  # (B, k, h, d)
        return net.attention_out(_merge_heads(net, spec, context), attention)


def _no_steps(net: Net, spec: ModelSpec, lead: int, rows: str) -> str:
    """A cache of no steps yet, (lead, rows, h, 0, d) zeros, for `rows` (1,)."""
    shape = net.one("Concat", [net.weight("lead", np.array([lead], np.int64)), rows,
                               net.weight("hd", np.array([spec.n_heads, 0, spec.head_dim], np.int64))], axis=0)
    return net.one("ConstantOfShape", [shape], value=helper.make_tensor("z", FLOAT, [1], [0.0]))


def own_slots(net: Net, index: str) -> str:
    """(n, n) bool, true on the diagonal, for `index` the (n,) range 0 .. n - 1: of a block's n new cache slots,
    query j reads slot j (a beam its own, an input in a block its own)."""
    axis = (net.weight("axis", np.array([a], np.int64)) for a in (1, 0))
    return net.one("Equal", [net.one("Unsqueeze", [index, next(axis)]), net.one("Unsqueeze", [index, next(axis)])])


def _merge_heads(net: Net, spec: ModelSpec, context: str) -> str:
    """(B, k, [1,] h, d) -> (B, k, E), or on 2-D rows (net.rows): (B k, E)."""
    shape = [-1, spec.d_model] if net.rows else [0, 0, spec.d_model]
    return net.one("Reshape", [context, net.weight("merged", np.array(shape, np.int64))])


def _merged(net: Net, width: int) -> list[int]:
    """The shape one query token's heads merge back into: the stream's, (B, E) on 2-D rows, else (B, 1, E)."""
    return [-1, width] if net.rows else [-1, 1, width]


def _scaled_qkv(net: Net, attention: MultiHeadAttention, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged Q/K/V weights (E, 3E) and bias (3E,), the queries' part scaled by 1/sqrt(d) (the values' bias as
    `net.value_bias_of` gives it)."""
    scale = torch.tensor(1.0 / np.sqrt(head_dim), dtype=torch.float32)
    w = torch.cat([attention.queries.weight * scale, attention.keys.weight, attention.values.weight]).T
    b = torch.cat([attention.queries.bias * scale, attention.keys.bias, net.value_bias_of(attention)])
    return w, b


def mask_bias(net: Net, lengths32: str, keys: str, shape: list[int] | None = None, fill: float = -np.inf) -> str:
    """(B, 1, 1, Ls) (or `shape`) additive mask: 0 for source positions < length, `fill` after; Ls from keys
    (B, h, Ls, d)."""
    length = net.one("Cast", [net.one("Squeeze", [net.one("Shape", [keys], start=2, end=3)])], to=INT32)
    index = net.one("Range", [net.weight("zero", np.array(0, np.int32)), length,
                              net.weight("one", np.array(1, np.int32))])  # (Ls,)
    lengths = net.one("Unsqueeze", [lengths32, net.weight("axis1", np.array([1], np.int64))])  # (B, 1)
    bias = net.one("Where", [net.one("Less", [index, lengths]), net.weight("zero_f", np.array(0.0, np.float32)),
                             net.weight("fill", np.array(fill, np.float32))])  # (B, Ls)
    return net.one("Reshape", [bias, net.weight("shape", np.array(shape or [0, 1, 1, -1], np.int64))])
