"""An explicit GRU cell for one decoder step, reading an nn.GRU's own parameters.

Exported as is, a decoder's nn.GRU becomes the ONNX GRU op with sequence length 1, which onnxruntime's CPU kernel
runs well below its Gemm speed: written out as Gemms and gate arithmetic, one GRU step takes 0.55-0.8x the op's time
at batch 64 and 256 (hidden 64 to 256) and the same at batch 1 (benchmarks/cpu_step_bench.py times whole decodes).
The arithmetic is PyTorch's formula
(https://pytorch.org/docs/stable/generated/torch.nn.GRU.html), per layer l with input x (layer l > 0 reads layer
l - 1's new h):
    r = s(W_ir x + b_ir + W_hr h + b_hr)     z = s(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))      h' = (1 - z) * n + z * h
nn.LSTM keeps its op: written out, an LSTM step took 0.95-1.08x the LSTM op's time, so there is nothing to gain.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class ExplicitGRU(nn.Module):
    """One step of a unidirectional (multi-layer) nn.GRU: x (N, I), h (layers, N, H) -> top h' (N, H), h'."""

    def __init__(self, rnn: nn.GRU) -> None:
        super().__init__()
        if not isinstance(rnn, nn.GRU) or rnn.bidirectional or not rnn.bias:
            raise TypeError(f"ExplicitGRU needs a unidirectional nn.GRU with biases, got {rnn!r}")
        self.rnn = rnn  # the parameters stay the model's own: the graph exports exactly what was trained

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layers = []
        for layer in range(self.rnn.num_layers):
            x = gru_cell(x, h[layer], *(getattr(self.rnn, f"{name}_l{layer}")
                                        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))  # (N, H)
            layers.append(x)
        # one layer: an Unsqueeze, not Unsqueeze + Concat
        return x, layers[0][None] if len(layers) == 1 else torch.stack(layers)  # (N, H), (layers, N, H)


def gru_cell(x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
             b_hh: torch.Tensor) -> torch.Tensor:
    """nn.GRU's update for one position: x (N, I), h (N, H) -> h' (N, H)."""
    size = w_hh.shape[1]  # a Python int, so every weight slice below is folded into a constant at export
    rz, n = slice(0, 2 * size), slice(2 * size, 3 * size)
    # Each addmm is one Gemm; the input product is the C of the hidden one, so no Add joins them, and onnxruntime
    # fuses the Sigmoid into that Gemm.
    rz_pre = torch.addmm(torch.addmm(b_ih[rz] + b_hh[rz], x, w_ih[rz].t()), h, w_hh[rz].t())  # (N, 2H)
    r, z = torch.sigmoid(rz_pre).split(size, dim=-1)  # (N, H) each
    n = torch.tanh(torch.addmm(b_ih[n], x, w_ih[n].t()) + r * torch.addmm(b_hh[n], h, w_hh[n].t()))  # (N, H)
    return n + z * (h - n)  # = (1 - z) * n + z * h, one node fewer
