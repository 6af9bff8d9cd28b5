"""Biases carried by a pre-norm LayerNorm's output, so that the products after it add them at no kernel's cost.

A LayerNorm's output is y = g * n + beta with n = (x - mean) / std, whose entries sum to 0. Lifting its beta by
s * g (s = +-1) makes y' = y + s g, and the direction u = (1 / g) / kappa, kappa = sum(beta / g) + s E, gives
y' . u = (sum(n) + sum(beta / g) + s E) / kappa = 1 for every input: a constant the products can use as a column of
ones. A product y W + b after the norm is then y' W' with W' = W + u (b - s g W) (rank one, made once at export),
with no Add; an FFN's first product gets one more column, u, whose output is 1 (Relu keeps it), and its second
product one more row, its bias. The sign s keeps |kappa| >= E, so the constant carries float32 rounding of ~1e-7 of
the biases it multiplies. A norm with some |g| at or below LIFT_MIN_GAMMA of its largest, or whose direction has an
entry over LIFT_MAX_DIRECTION, is not lifted (1 / g would blow up the rank-one term, and the folded
cross-attention's padding, FAR u, past float32's range). Only where the norm's output feeds nothing but such
products (pre-norm: the cross-attention's query, the FFN, the output projection); the residual stream itself is
untouched.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from .int8 import int8_columns

if TYPE_CHECKING:
    from runtime.spec import ModelSpec

    from .kernels import Net

LIFT_MIN_GAMMA = 1e-2
LIFT_MAX_DIRECTION = 1e6  # |u| above it: tiny gains throughout (|u| = 1 / (|g| |kappa|), |kappa| >= E)


class Lift(NamedTuple):
    """What lifting a LayerNorm adds to its beta (E,), and the direction u (E,) along which its output reads 1."""

    beta_add: torch.Tensor
    direction: torch.Tensor


def lift(norm: torch.nn.Module) -> Lift | None:
    """The lift of a LayerNorm with a per-feature weight and bias, or None where it cannot be lifted."""
    if not isinstance(norm, torch.nn.LayerNorm) or norm.weight is None or norm.bias is None:
        return None
    g, beta = norm.weight.detach().double(), norm.bias.detach().double()
    if float(g.abs().min()) <= LIFT_MIN_GAMMA * float(g.abs().max()):
        return None
    base = float((beta / g).sum())
    s = 1.0 if base >= 0 else -1.0
    direction = (1.0 / g) / (base + s * g.numel())
    return Lift(s * g, direction) if float(direction.abs().max()) <= LIFT_MAX_DIRECTION else None


def lift_in(net: Net, spec: ModelSpec, norm: torch.nn.Module) -> Lift | None:
    """The norm's lift in the graph `net` writes: where the graph lifts (`Net.lifts`) a pre-norm stack's norms."""
    return lift(norm) if net.lifts and spec.norm == "pre" else None


def rank_one(w: torch.Tensor, b: torch.Tensor | None, by: Lift) -> tuple[torch.Tensor, torch.Tensor]:
    """What a product y w + b (w (in, out)) read after the lifted norm adds to w, as its two factors: y' (w + u c) =
    y w + b with u (in, 1), c (1, out)."""
    w64 = w.detach().double()
    c = -(by.beta_add @ w64) if b is None else b.detach().double() - by.beta_add @ w64
    return by.direction[:, None], c[None, :]


def product(net: Net, x: str, w: torch.Tensor, b: torch.Tensor | None, by: Lift | None) -> str:
    """x w + b for x read from the norm lifted `by`: one MatMul (`by` None: Net.matmul, its bias its own)."""
    return net.matmul(x, w, b) if by is None else net.one("MatMul", [x, _weight(net, w, b, by)])


def ffn(net: Net, x: str, linear1: torch.nn.Linear, linear2: torch.nn.Linear, by: Lift) -> str:
    """linear2(relu(linear1(y))) for x = y lifted `by`: linear1's product gets one more column, u, whose output
    reads 1 (Relu keeps it), and linear2's one more row, its bias: MatMul, Relu, MatMul."""
    first = net.one("Concat", [_weight(net, linear1.weight.T, linear1.bias, by),
                               net.weight("u", by.direction.float()[:, None])], axis=1)  # (E, F + 1)
    bias = torch.zeros(linear2.out_features) if linear2.bias is None else linear2.bias.detach()
    second = net.one("Concat", [_weight(net, linear2.weight.T, None, None),
                                net.weight("b", bias.float()[None, :])], axis=0)  # (F + 1, E)
    return net.one("MatMul", [net.one("Relu", [net.one("MatMul", [x, first])]), second])


def _weight(net: Net, w: torch.Tensor, b: torch.Tensor | None, by: Lift | None) -> str:
    """w (widened int8: its int8 weights widened in the graph) plus its rank-one term (none without `by`): nodes
    over constants, which onnxruntime folds into one weight as it loads the graph, the same in float32 and widened
    graphs (float32 arithmetic over the same values: export.tokens.kernels.Net.widen)."""
    base = net.widened(w) if net.widen else net.weight("w", w)
    if by is None:
        return base
    if net.widen:  # the terms are solved against the weights the graph multiplies by
        q, scale = int8_columns(w.detach().cpu().numpy())
        w = torch.from_numpy(q.astype(np.float32) * scale)
    u, c = rank_one(w, b, by)
    return net.one("Add", [base, net.one("Mul", [net.weight("u", u.float()), net.weight("c", c.float())])])
