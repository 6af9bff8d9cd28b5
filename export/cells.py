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

A token decoder's first layer reads an embedding row: its input products W_i(rz) x + b and W_in x + b depend on the
previous token alone, so with `embedding` they are looked up in two tables of one row per token, made once at
export (`input_tables`): a step runs two Gathers instead of the embedding's Gather and two Gemms (the dates GRU
model's greedy loop 0.96x the time at batch 1, 0.97x at 64). Only where the tables hold no more values than the
embedding and input weights they stand in for (`tables_fit`: V x 3H <= V x E + 3H x E, so about V <= E): past that
every step graph would grow by them (at V 1100, H 317, E 32: 1.55x the float32 export, 2.7x the int8 one, whose
tables stay float32 as constants of the traced graph, which int8's quantizer leaves; no faster measured there).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ExplicitGRU(nn.Module):
    """One step of a unidirectional (multi-layer) nn.GRU: x (N, I), h (layers, N, H) -> top h' (N, H), h'. With
    `embedding` (whose rows the GRU reads), x is (N,) token ids, and the first layer's input products are looked up
    (`input_tables`) where `lookup` says so (None: where `tables_fit`), else the ids are embedded."""

    def __init__(self, rnn: nn.GRU, embedding: nn.Embedding | None = None, lookup: bool | None = None) -> None:
        super().__init__()
        if not isinstance(rnn, nn.GRU) or rnn.bidirectional or not rnn.bias:
            raise TypeError(f"ExplicitGRU needs a unidirectional nn.GRU with biases, got {rnn!r}")
        self.rnn = rnn  # the parameters stay the model's own: the graph exports exactly what was trained
        self.embedding = embedding
        self.looked_up = embedding is not None and (tables_fit(rnn, embedding) if lookup is None else lookup)
        if self.looked_up:
            rz, n = input_tables(rnn, embedding)
            self.register_buffer("table_rz", rz, persistent=False)
            self.register_buffer("table_n", n, persistent=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layers = []
        for layer in range(self.rnn.num_layers):
            weights = [getattr(self.rnn, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih",
                                                                         "bias_hh")]
            if layer == 0 and self.looked_up:
                x = looked_up_cell(F.embedding(x, self.table_rz), F.embedding(x, self.table_n), h[0], *weights[1::2])
            else:
                if layer == 0 and self.embedding is not None:
                    x = self.embedding(x)
                x = gru_cell(x, h[layer], *weights)  # (N, H)
            layers.append(x)
        # one layer: an Unsqueeze, not Unsqueeze + Concat
        return x, layers[0][None] if len(layers) == 1 else torch.stack(layers)  # (N, H), (layers, N, H)


def gru_cell(x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
             b_hh: torch.Tensor) -> torch.Tensor:
    """nn.GRU's update for one position: x (N, I), h (N, H) -> h' (N, H)."""
    return looked_up_cell(*input_products(x, w_ih, b_ih, b_hh), h, w_hh, b_hh)


def input_products(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor,
                   b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, I) -> what the gates add from the input: (N, 2H) W_i(rz) x + b_i(rz) + b_h(rz) (the hidden product's
    C in `looked_up_cell`: one Gemm each, no Add joins them) and (N, H) W_in x + b_in."""
    size = w_ih.shape[0] // 3  # a Python int, so every weight slice below is folded into a constant at export
    rz, n = slice(0, 2 * size), slice(2 * size, 3 * size)
    return torch.addmm(b_ih[rz] + b_hh[rz], x, w_ih[rz].t()), torch.addmm(b_ih[n], x, w_ih[n].t())


def tables_fit(rnn: nn.GRU, embedding: nn.Embedding) -> bool:
    """Whether `input_tables` hold no more values than the embedding and the first layer's input weights."""
    tokens, width, gates = embedding.num_embeddings, embedding.embedding_dim, 3 * rnn.hidden_size
    return tokens * gates <= tokens * width + gates * width


def input_tables(rnn: nn.GRU, embedding: nn.Embedding) -> tuple[torch.Tensor, torch.Tensor]:
    """The first layer's `input_products` for every token: (V, 2H) and (V, H), for the rows of `embedding`."""
    with torch.no_grad():
        return input_products(embedding.weight, rnn.weight_ih_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)


def looked_up_cell(rz_in: torch.Tensor, n_in: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor,
                   b_hh: torch.Tensor) -> torch.Tensor:
    """`gru_cell` with its `input_products` given (from `input_tables`, or just made): h (N, H) -> h' (N, H)."""
    size = w_hh.shape[1]
    rz, n = slice(0, 2 * size), slice(2 * size, 3 * size)
    # onnxruntime fuses the Sigmoid into the hidden product's Gemm
    r, z = torch.sigmoid(torch.addmm(rz_in, h, w_hh[rz].t())).split(size, dim=-1)  # (N, H) each
    n = torch.tanh(n_in + r * torch.addmm(b_hh[n], h, w_hh[n].t()))  # (N, H)
    return n + z * (h - n)  # = (1 - z) * n + z * h, one node fewer
