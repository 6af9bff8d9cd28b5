"""Export modules for token models, with flat tensor arguments named by the contract. They reuse the model's own
`encode` and `step`, so the graphs compute exactly what the PyTorch reference decode does, for any token model."""
from __future__ import annotations

import torch
import torch.nn as nn

from runtime.contract import ENCODER_FILE, FEEDBACK, graph_io, token_decoder_outputs, token_decoder_state
from runtime.spec import ModelSpec
from training.token_base import TokenModel


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
        self.input_names = ["previous_tokens", *token_decoder_state(spec)]
        self.output_names = list(token_decoder_outputs(spec))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.input_names, inputs))
        log_probs, state, alphas = self.model.step(feed.pop("previous_tokens"), feed)
        produced = {"log_probs": log_probs, "alphas": alphas}
        produced.update({out: state[into] for out, into in FEEDBACK.items() if into in state})
        return tuple(produced[name] for name in self.output_names)
