"""The one-call graphs' folded cross-attention, for small calls: each head's keys times its query projection and its
values times its rows of the output projection, made once per call (`fold_cross`), so a step runs two products, an
Add and a Softmax where `attention.Fused` runs the query projection, MultiHeadAttention and the output projection
(Folded; AncestryFolded for the beam graph's blocks). `fold_loop` writes the decode Loop with the folded body or the
plain one, picked per call by the sources' size."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx

from runtime.spec import ModelSpec
from training.tokens.transformer import MultiHeadAttention, TransformerSeq2Seq

from .attention import AncestryFused, Fused, mask_bias
from .kernels import MS, Net, graph, tensor


class Folded(Fused):
    """Fused self-attention; the cross-attention folded into per-input matrices that `fold_cross` makes once from
    the keys and values: scores = x @ S^T + bias, where S (B, h Ls, E) is each head's keys times its query
    projection (scaled), and bias (B, 1, h Ls) the keys times the query bias, plus the padding mask; and out =
    softmax per head @ O, where O (B, h Ls, E) is each head's values times its rows of fc_attn, plus 1/h of
    fc_attn's bias (each head's weights sum to 1, so the product adds the bias once: no bias Add a step). A step
    runs two MatMuls, an Add, a Softmax and two Reshapes where Fused runs the query MatMul, MultiHeadAttention's
    per-(row, head) products and the fc_attn MatMul (1 row, 13 source tokens: 2.6 against 5.0 us a layer a step).
    Only the one-call graphs: their cross-attention state is their own."""

    CROSS = 3  # S, bias, O per layer
    CROSS_BIAS = True

    def cross_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                        cross: list[str]) -> str:
        """x (B, k, E), cross [S, bias, O] -> fc_attn(context) (B, k, E), its bias included."""
        keys, bias, out_by = cross
        scores = net.one("Add", [net.one("FusedMatMul", [x, keys], MS, transB=1), bias])  # (B, k, h Ls)
        heads = net.one("Reshape", [scores, net.weight("heads", np.array([0, 0, spec.n_heads, -1], np.int64))])
        weights = net.one("Reshape", [net.one("Softmax", [heads], axis=-1),
                                      net.weight("flat", np.array([0, 0, -1], np.int64))])  # (B, k, h Ls)
        return net.one("MatMul", [weights, out_by])  # (B, k, E)


class AncestryFolded(Folded, AncestryFused):
    """AncestryFused's self-attention (the beam graph's blocks), Folded's cross-attention."""


FOLD_UP_TO = 8192  # a call's sources fold where S for all of them, inputs x n_heads x source_len x d_model values a
# layer, is at most this (32 KB): a step's two products do h times the arithmetic of MultiHeadAttention's and save
# its per-(input, head) overhead, which pays for small models and batches only. fast greedy loop, batch 1, 20 steps,
# folded / not (same weights): at h L E = 2048-8192, 0.91-0.96 (d_model 64 with 4 or 8 heads, 128 with 4, 256 with
# 8); at 16384, 0.96-1.01; at 32768, 1.06-1.08; at 131072, 1.16. dates transformer at 29 source tokens: greedy at
# batch 4, 1.03-1.04; beam 5 at batch 8, 1.04-1.07 (1.6 at 200 tokens). One session a side; with eight, at batch 1
# the crossover also moves with the steps: plain / folded 0.95-0.96 at 29 source tokens + 11 steps, 1.04 at 13 + 20.


def fold_tokens(spec: ModelSpec) -> int:
    """The most source tokens a call may hold in all (inputs x source_len) and run the folded body."""
    return FOLD_UP_TO // (spec.n_heads * spec.d_model)


def folds(spec: ModelSpec) -> bool:
    """Whether the one-call graphs hold a folded body: one input of the model's longest training source folds."""
    return spec.input_len <= fold_tokens(spec)


def fold_loop(net: Net, spec: ModelSpec, loop_inputs: list[str], count: int, keep: list[int], types: list[int],
              plain: Callable[[], onnx.GraphProto], folded: Callable[[Net], onnx.GraphProto] | None) -> list[str]:
    """The decode Loop (`loop_inputs`, `count` outputs, `keep` of them returned, of `types`): with the plain body
    (`plain()`) where the model does not fold (or `folded` is None), else in an If on this call's sources (B, L):
    with the folded body (`folded(branch)` writes the fold's nodes into the branch and returns that body) where
    B x n_heads x L x d_model <= FOLD_UP_TO, the plain one for larger batches and longer sources."""
    if folded is None or not folds(spec):
        outs = net.op("Loop", loop_inputs, count, body=plain())
        return [outs[i] for i in keep]
    size = net.one("ReduceProd", [net.one("Shape", ["source_ids"])], keepdims=0)  # B x L
    small = net.one("LessOrEqual", [size, net.weight("up_to", np.array(fold_tokens(spec), np.int64))])
    branches = []
    for prefix in ("fold/", "plain/"):
        branch = Net(prefix)
        outs = branch.op("Loop", loop_inputs, count, body=folded(branch) if prefix == "fold/" else plain())
        branches.append(graph(branch, prefix[:-1], [], [tensor(outs[i], t, None) for i, t in zip(keep, types)], ""))
    return net.op("If", [small], len(keep), then_branch=branches[0], else_branch=branches[1])


def fold_cross(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, cross: list[str], lengths32: str) -> list[str]:
    """Every decoder layer's keys, values (B, h, Ls, d) (k0, v0, k1, ...) -> its S, bias and O for Folded: one
    MatMul each by a per-head constant, (h, d, E) or (h, d, 1)."""
    h, d, e = spec.n_heads, spec.head_dim, spec.d_model
    scale = 1.0 / np.sqrt(d)
    padding = mask_bias(net, lengths32, cross[0], [0, 1, -1, 1])  # (B, 1, Ls, 1)
    by_row = net.weight("by_row", np.array([0, -1, e], np.int64))  # (B, h, Ls, E) -> (B, h Ls, E)
    row = net.weight("row", np.array([0, 1, -1], np.int64))  # (B, h, Ls, 1) -> (B, 1, h Ls)
    folded = []
    for layer, keys, values in zip(model.decoder_layers, cross[0::2], cross[1::2]):
        attention: MultiHeadAttention = layer.cross_attention
        queries = attention.queries.weight.detach().reshape(h, d, e) * scale  # (h, d, E): head i's rows
        query_bias = attention.queries.bias.detach().reshape(h, d, 1) * scale
        keys_by = net.one("Reshape", [net.one("MatMul", [keys, net.weight("queries", queries)]), by_row])
        bias = net.one("Add", [net.one("MatMul", [keys, net.weight("query_bias", query_bias)]), padding])
        out = attention.fc_attn.weight.detach().T.reshape(h, d, e)  # (h, d, E): head i's rows of fc_attn^T
        share = (attention.fc_attn.bias.detach() / h).reshape(1, 1, e)  # every head's rows: 1/h of the bias
        out_by = net.one("Reshape", [net.one("Add", [net.one("MatMul", [values, net.weight("out", out)]),
                                                     net.weight("out_bias", share)]), by_row])
        folded += [keys_by, net.one("Reshape", [bias, row]), out_by]
    return folded
