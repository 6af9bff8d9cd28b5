"""The residual stream of a transformer stack as `export.tokens.kernels` writes it: the running sum, what the next
sub-layer reads, and the residual adds with their biases and LayerNorms (one SkipLayerNormalization, or Add +
LayerNormalization), a pre-norm's LayerNorm lifted where the products after it carry their biases
(export.tokens.lift)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from training.tokens.transformer import MultiHeadAttention, Residual

from . import lift as lifting
from .lift import Lift

if TYPE_CHECKING:
    from .kernels import Net

MS = "com.microsoft"
LN_EPSILON = 1e-5  # nn.LayerNorm's default, which every norm of the model uses


class Stream:
    """The residual stream of a pre- or post-norm stack: `x` is the running sum; `inner` what the next sub-layer
    reads (LN(x) in pre-norm, x in post-norm). `add` folds the residual add, the sub-layer's output bias and the
    next LayerNorm into one SkipLayerNormalization."""

    def __init__(self, net: Net, pre: bool, x: str, inner: str) -> None:
        self.net, self.pre, self.x, self.inner = net, pre, x, inner

    def add(self, sub: str, bias: torch.Tensor | None, after: Residual, next_norm: torch.nn.Module | None,
            lifted: Lift | None = None) -> None:
        """x = x + sub + bias (None: sub holds its bias); then inner = next_norm(x) (pre; `lifted`: its beta lifted) or
        x = after.norm(x) (post)."""
        net = self.net
        if self.pre:
            if next_norm is None or isinstance(next_norm, torch.nn.Identity):
                self.x = net.one("Add", [sub if bias is None else net.one("Add", [sub, net.weight("b", bias)]),
                                         self.x])
                self.inner = self.x
                return
            norm = _skip_norm(net, sub, self.x, next_norm, bias, lifted)
            self.inner, self.x = norm[0], norm[3]
        else:
            self.x = _skip_norm(net, sub, self.x, after.norm, bias)[0]
            self.inner = self.x

    def add_linear(self, x: str, layer: torch.nn.Linear, after: Residual, next_norm: torch.nn.Module | None,
                   bias: bool = True, lifted: Lift | None = None) -> None:
        """add(x W^T, b), the bias where it costs no kernel (Net.out_projection), else in the residual add;
        bias=False: x already carries it (an attention's values took it, Net.shift)."""
        if not bias:
            self.add(self.net.linear(x, layer, bias=False), None, after, next_norm, lifted)
            return
        self.add(self.net.out_projection(x, layer), None if self.net.bias_in_matmul else layer.bias, after,
                 next_norm, lifted)

    def add_ffn(self, linear1: torch.nn.Linear, linear2: torch.nn.Linear, after: Residual,
                next_norm: torch.nn.Module | None, ffn_lift: Lift | None, lifted: Lift | None = None) -> None:
        """add(linear2(relu(linear1(inner)))): both biases on `inner` where it is lifted (`ffn_lift`, the lift its
        norm took: lift.ffn), else MatMul + Add + Relu and add_linear."""
        if ffn_lift is None:
            hidden = self.net.one("Relu", [self.net.linear(self.inner, linear1)])  # (.., F)
            self.add_linear(hidden, linear2, after, next_norm, lifted=lifted)
        else:
            self.add(lifting.ffn(self.net, self.inner, linear1, linear2, ffn_lift), None, after, next_norm, lifted)

    def add_attention(self, x: str, attention: MultiHeadAttention, after: Residual,
                      next_norm: torch.nn.Module | None, lifted: Lift | None = None) -> None:
        """add_linear of attention's output projection: its bias left out where the values took it."""
        self.add_linear(x, attention.fc_attn, after, next_norm, bias=self.net.shift(attention) is None,
                        lifted=lifted)


def _skip_norm(net: Net, sub: str, skip: str, norm: torch.nn.LayerNorm, bias: torch.Tensor | None,
               lifted: Lift | None = None) -> list[str]:
    """LN(sub + skip + bias) (its beta `lifted`) and (4th output) the sum itself, as SkipLayerNormalization
    does."""
    beta = norm.bias if lifted is None else norm.bias.detach().double() + lifted.beta_add
    gamma, beta = net.weight("gamma", norm.weight), net.weight("beta", beta)
    if not net.skip_norm:
        total = net.one("Add", [sub if bias is None else net.one("Add", [sub, net.weight("bias", bias)]), skip])
        return [net.one("LayerNormalization", [total, gamma, beta], axis=-1, epsilon=LN_EPSILON), "", "", total]
    inputs = [sub, skip, gamma, beta] + ([net.weight("bias", bias)] if bias is not None else [])
    return net.op("SkipLayerNormalization", inputs, 4, MS, epsilon=LN_EPSILON)


def start(net: Net, pre: bool, tokens: str, positions: str, first: Residual) -> Stream:
    """The stream at embedding + position: both (.., S, E) or positions (S, E); pre-norm reads first.norm of it."""
    if pre:
        norm = _skip_norm(net, tokens, positions, first.norm, None)
        return Stream(net, pre, norm[3], norm[0])
    x = net.one("Add", [tokens, positions])
    return Stream(net, pre, x, x)
