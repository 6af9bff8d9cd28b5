"""Small export modules with flat tensor arguments, one per graph. The encoder reuses the model's stateless `encode`,
so it computes exactly what the reference decode does. The step computes what the decoder's `step` does, in a form
onnxruntime's CPU kernels run faster (measured in benchmarks/cpu_step_bench.py; parity with `step` is checked at
every export):
- the GRU advances through `cells.ExplicitGRU` (Gemms and gate arithmetic) instead of a GRU op of length 1;
- the query projection carries the attention's 1/sqrt(d_k), so no Div follows the scores' MatMul (onnxruntime would
  fuse MatMul and Div into a FusedMatMul, which is slower there than MatMul), and multi-head attention projects
  every head's query with one Gemm;
- the source mask is applied by one Where: at batch 1 a step's time is mostly per-node overhead."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from export.cells import ExplicitGRU
from export.examples import EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN, Traced
from runtime.contract import (
    DECODER_STEP_FILE,
    ENCODER_FILE,
    GREEDY_FILE,
    decoder_inputs,
    decoder_outputs,
    encoder_outputs,
)
from runtime.spec import ModelSpec
from training.points.decode import encode
from training.points.models import (
    MASK_FILL,
    Attention,
    DecoderAttn,
    EncoderDecoder,
    MultiHeadAttention,
)


class EncoderGraph(nn.Module):
    """source (N, L, F), source_mask (N, 1, L) -> hidden, decoder_input[, keys_t, values]."""

    def __init__(self, model: EncoderDecoder, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.output_names = list(encoder_outputs(spec))

    def forward(self, source: torch.Tensor, source_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = encode(self.model, source, source_mask)
        return tuple(states[name] for name in self.output_names)


class DecoderStepGraph(nn.Module):
    """One decoder step: decoder_input, hidden[, keys_t, values, source_mask] -> output, hidden_out[, alphas]."""

    def __init__(self, model: EncoderDecoder, spec: ModelSpec) -> None:
        super().__init__()
        self.decoder = model.decoder
        self.cell = ExplicitGRU(self.decoder.basic_rnn)
        self.input_names = list(decoder_inputs(spec))
        self.output_names = list(decoder_outputs(spec))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.input_names, inputs))
        query, hidden = self.cell(feed["decoder_input"][:, 0], feed["hidden"])  # (N, H), (1, N, H)
        if not isinstance(self.decoder, DecoderAttn):
            return self.decoder.regression(query).unsqueeze(1), hidden  # (N, 1, F): an Unsqueeze the loop can drop
        context, alphas = attend(self.decoder.attn, query, feed["keys_t"], feed["values"], feed["source_mask"])
        # DecoderAttn.readout on (N, 2H) rows: one Gemm, where the (N, 1, 2H) form is MatMul + Add
        features = torch.cat([context, query], dim=-1)  # (N, 2H)
        return self.decoder.regression(features).unsqueeze(1), hidden, alphas


def attend(attn: Attention | MultiHeadAttention, query: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor,
           mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`attn.attend` for a query (N, H) -> context (N, H), alphas (N, [heads,] 1, L)."""
    if isinstance(attn, Attention):
        proj_query = scaled_query([attn], query).view(-1, 1, attn.d_k)  # (N, 1, H)
        context, alphas = masked_weigh(torch.matmul(proj_query, keys_t), values, mask)  # (N, 1, H)
        return context.view(-1, attn.d_k), alphas  # (N, H)
    heads, d_k = len(attn.attn_heads), attn.attn_heads[0].d_k
    proj_query = scaled_query(list(attn.attn_heads), query).view(-1, heads, 1, d_k)  # (N, heads, 1, H)
    context, alphas = masked_weigh(torch.matmul(proj_query, keys_t), values, mask.unsqueeze(1))  # (N, heads, 1, H)
    # heads side by side, as MultiHeadAttention.attend's transpose(1, 2): the axis of size 1 moves nothing
    return attn.linear_out(context.reshape(-1, heads * d_k)), alphas  # (N, heads*H) -> (N, H)


def scaled_query(heads: list[Attention], query: torch.Tensor) -> torch.Tensor:
    """Every head's query projection divided by sqrt(d_k), as one Gemm: (N, H) -> (N, heads*H)."""
    scale = math.sqrt(heads[0].d_k)
    weight = torch.cat([a.linear_query.weight for a in heads]) / scale  # (heads*H, H), folded at export
    bias = torch.cat([a.linear_query.bias for a in heads]) / scale
    return F.linear(query, weight, bias)


def masked_weigh(scores: torch.Tensor, values: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`training.points.models.weigh` with the mask applied by one Where (masked_fill(mask == 0) exports three nodes)."""
    alphas = torch.softmax(torch.where(mask, scores, MASK_FILL), dim=-1)  # (..., 1, L)
    return torch.matmul(alphas, values), alphas  # (..., 1, H)


DOCS = {
    ENCODER_FILE: "seq2onnx encoder: run once per request. source (batch, source_len, F) and source_mask "
    "(batch, 1, source_len; True = real point) -> decoder's first input and hidden state, and the "
    "attention's projected keys and values.",
    DECODER_STEP_FILE: "seq2onnx decoder step: run once per output point, feeding output/hidden_out back "
    "as decoder_input/hidden.",
    GREEDY_FILE: "seq2onnx greedy loop: every decoder step in one ONNX Loop, run once per request after the encoder. "
    "The encoder's outputs and source_mask, and target_len (int64 scalar, >= 1) -> outputs (batch, decode_len, F) "
    "and alphas, decode_len = target_len.",
}


def graph_docs(spec: ModelSpec) -> dict[str, str]:
    """Each graph's doc string (shown by Netron): how to feed it and what to feed back."""
    return DOCS


def traced(model: EncoderDecoder, spec: ModelSpec) -> Traced:
    """The export modules and seeded example inputs: random sources, every point real."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(EXAMPLE_BATCH, 1, EXAMPLE_SOURCE_LEN, dtype=torch.bool)  # (N, 1, Ls)
    source = torch.randn(EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN, spec.n_features, generator=gen)  # (N, Ls, F)
    return Traced(EncoderGraph(model, spec), DecoderStepGraph(model, spec), (source, mask), {"source_mask": mask})
