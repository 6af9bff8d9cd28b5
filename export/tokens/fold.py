"""The one-call graphs' folded cross-attention, for small calls: each head's keys times its query projection and its
values times its rows of the output projection, made once per call (`fold_cross`), so a step runs two products and a
Softmax (and an Add where the norm before it is not lifted: export.tokens.lift) where `attention.Fused` runs the
query projection, MultiHeadAttention and the output projection (Folded; AncestryFolded for the beam graph's blocks).
The export writes them as graphs of their own (fold_greedy.onnx, fold_beam.onnx, and fold_few_beam.onnx for few
inputs: runtime.token_steps.FEW_BEAM_INPUTS) beside the plain ones, and the runtime picks per call by the sources'
size (optional_graphs.fold_tokens): an If inside one graph made the same choice at ~2.6% of a greedy batch-1 call."""
from __future__ import annotations

import numpy as np
import torch

from runtime.spec import ModelSpec
from training.tokens.transformer import MultiHeadAttention, TransformerSeq2Seq

from .attention import AncestryFused, Fused, mask_bias
from .kernels import MS, Net
from .lift import Lift, lift, lift_in

# A lifted fold's padding score (-inf there would make NaN: S holds it as FAR u): far below any score, and, with
# |u| <= lift.LIFT_MAX_DIRECTION, far enough from float32's limit that FAR u and its sum with S stay finite
FAR = -1e30


class Folded(Fused):
    """Fused self-attention; the cross-attention folded into per-input matrices that `fold_cross` makes once from
    the keys and values: scores = x @ S^T + bias, where S (B, h Ls, E) is each head's keys times its query
    projection (scaled), and bias (B, 1, h Ls) the keys times the query bias, plus the padding mask (lifted: x is
    the lifted norm's output and S holds the bias, scores = x @ S^T, no Add); and out = softmax per head @ O, where
    O (B, h Ls, E) is each head's values times its rows of fc_attn, plus 1/h of fc_attn's bias (each head's weights
    sum to 1, so the product adds the bias once: no bias Add a step). A step runs two MatMuls, an Add (none lifted),
    a Softmax and two Reshapes where Fused runs the query MatMul, MultiHeadAttention's per-(row, head) products and
    the fc_attn MatMul (1 row, 13 source tokens: 2.6 against 5.0 us a layer a step). Only the one-call graphs: their
    cross-attention state is their own."""

    CROSS = 3  # S, bias, O per layer
    CROSS_BIAS = True

    @staticmethod
    def cross_lift(norm: torch.nn.Module, cross: list[str]) -> Lift | None:
        """The lift `x` must carry for cross (fold_cross's, whose bias is then "": in S), or None."""
        return lift(norm) if cross[1] == "" else None

    def cross_attention(self, net: Net, spec: ModelSpec, x: str, attention: MultiHeadAttention,
                        cross: list[str]) -> str:
        """x (B, k, E), cross [S, bias, O] -> fc_attn(context) (B, k, E), its bias included (bias "": x is
        lifted and S holds it)."""
        keys, bias, out_by = cross
        scores = net.one("FusedMatMul", [x, keys], MS, transB=1)  # (B, k, h Ls)
        scores = scores if bias == "" else net.one("Add", [scores, bias])
        heads = net.one("Reshape", [scores, net.weight("heads", np.array([0, 0, spec.n_heads, -1], np.int64))])
        weights = net.one("Reshape", [net.one("Softmax", [heads], axis=-1),
                                      net.weight("flat", np.array([0, 0, -1], np.int64))])  # (B, k, h Ls)
        return net.one("MatMul", [weights, out_by])  # (B, k, E)


class AncestryFolded(Folded, AncestryFused):
    """AncestryFused's self-attention (the beam graph's blocks), Folded's cross-attention."""


def fold_cross(net: Net, model: TransformerSeq2Seq, spec: ModelSpec, cross: list[str], lengths32: str) -> list[str]:
    """Every decoder layer's keys, values (B, h, Ls, d) (k0, v0, k1, ...) -> its S, bias and O for Folded: one
    MatMul each by a per-head constant, (h, d, E) or (h, d, 1). Where the decoder's norm before the cross-attention
    is lifted (`net.lifts`, pre-norm; export.tokens.lift), S holds the bias instead: the query bias
    q_b rides on the norm (queries' = queries + (q_b - queries beta_add) u^T), the padding is FAR u added to S (a Mul
    and an Add a call), and the bias is ""."""
    h, d, e = spec.n_heads, spec.head_dim, spec.d_model
    scale = 1.0 / np.sqrt(d)
    lifts = [lift_in(net, spec, layer.res2.norm) for layer in model.decoder_layers]
    padding = {fill: mask_bias(net, lengths32, cross[0], [0, 1, -1, 1], fill)  # (B, 1, Ls, 1)
               for fill in {-np.inf if by is None else FAR for by in lifts}}
    by_row = net.weight("by_row", np.array([0, -1, e], np.int64))  # (B, h, Ls, E) -> (B, h Ls, E)
    folded = []
    row = net.weight("row", np.array([0, 1, -1], np.int64)) if None in lifts else ""  # (B, h, Ls, 1) -> (B, 1, h Ls)
    for layer, keys, values, by in zip(model.decoder_layers, cross[0::2], cross[1::2], lifts):
        attention: MultiHeadAttention = layer.cross_attention
        queries = net.effective(attention.queries).weight.detach().double().reshape(h, d, e) * scale  # (h, d, E)
        query_bias = attention.queries.bias.detach().double().reshape(h, d, 1) * scale
        if by is not None:
            queries = queries + (query_bias - queries @ by.beta_add[:, None]) * by.direction
            keys_by = net.one("MatMul", [keys, net.weight("queries", queries.float())])  # (B, h, Ls, E)
            keys_by = net.one("Add", [keys_by, net.one("Mul", [padding[FAR], net.weight("u", by.direction.float())])])
            folded += [net.one("Reshape", [keys_by, by_row]), ""]
        else:
            keys_by = net.one("Reshape", [net.one("MatMul", [keys, net.weight("queries", queries.float())]), by_row])
            bias = net.one("MatMul", [keys, net.weight("query_bias", query_bias.float())])  # (B, h, Ls, 1)
            bias = net.one("Add", [bias, padding[-np.inf]])
            folded += [keys_by, net.one("Reshape", [bias, row])]
        out = net.effective(attention.fc_attn).weight.detach().T.reshape(h, d, e)  # (h, d, E): fc_attn^T's rows
        out_by = net.one("MatMul", [values, net.weight("out", out)])
        if net.shift(attention) is None:  # every head's rows: 1/h of the bias (else the values took it already)
            share = (attention.fc_attn.bias.detach() / h).reshape(1, 1, e)
            out_by = net.one("Add", [out_by, net.weight("out_bias", share)])
        folded.append(net.one("Reshape", [out_by, by_row]))
    return folded
