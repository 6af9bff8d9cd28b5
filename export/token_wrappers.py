"""Export modules for token models, with flat tensor arguments named by the contract. They reuse the model's own
`encode` and `step`, so the graphs compute exactly what the PyTorch reference decode does, for any token model; a
recurrent GRU model's step differs only in how its GRU advances: through `cells.ExplicitGRU` (Gemms and gate
arithmetic), which onnxruntime's CPU kernels run faster than a GRU op of length 1 (benchmarks/cpu_step_bench.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from runtime.contract import (
    ENCODER_FILE,
    FEEDBACK,
    graph_io,
    token_decoder_outputs,
    token_decoder_state,
)
from runtime.spec import ModelSpec
from training.recurrent import TokenSeq2Seq
from training.token_base import TensorState, TokenModel

from .cells import ExplicitGRU


class TokenEncoderGraph(nn.Module):
    """source_ids (N, L) int64, source_lengths (N,) int64 -> the first step's state and the memory."""

    def __init__(self, model: TokenModel, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.output_names = list(graph_io(spec)[ENCODER_FILE]["outputs"])

    def forward(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.encode(source_ids, source_lengths)
        return tuple(states[name] for name in self.output_names)


class TokenStepGraph(nn.Module):
    """One step: previous_tokens (N,) and the state -> log_probs (N, V), the fed-back state, alphas."""

    def __init__(self, model: TokenModel, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        gru = isinstance(model, TokenSeq2Seq) and spec.cell == "gru"  # an LSTM keeps its op: as fast (cells.py)
        self.cell = ExplicitGRU(model.decoder.rnn) if gru else None
        self.input_names = ["previous_tokens", *token_decoder_state(spec)]
        self.output_names = list(token_decoder_outputs(spec))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.input_names, inputs))
        previous = feed.pop("previous_tokens")
        if self.cell is None:
            log_probs, state, alphas = self.model.step(previous, feed)
        else:
            log_probs, state, alphas = self.gru_step(previous, feed)
        produced = {"log_probs": log_probs, "alphas": alphas}
        produced.update({out: state[into] for out, into in FEEDBACK.items() if into in state})
        return tuple(produced[name] for name in self.output_names)

    def gru_step(self, previous: torch.Tensor,
                 state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        """`TokenSeq2Seq.step` (that is `TokenDecoder.step`) with the explicit cell in place of the GRU."""
        decoder = self.model.decoder
        features, hidden = self.cell(decoder.embedding(previous), state["hidden"])  # (N, H), (layers, N, H)
        alphas = None
        if decoder.attention is not None:
            context, alphas = decoder.attention(features, state)  # (N, D), (N, L)
            features = torch.cat([features, context], dim=-1)  # (N, H + D)
        log_probs = F.log_softmax(decoder._logits(features), dim=-1)  # (N, V)
        return log_probs, {**state, "hidden": hidden}, alphas
