"""Small export modules with flat tensor arguments, one per graph. They reuse the model's
stateless cores (`encode`, `step`), so the graphs compute exactly what the reference decode does."""
from __future__ import annotations

import torch
import torch.nn as nn

from runtime.contract import decoder_inputs, decoder_outputs, encoder_outputs
from runtime.spec import ModelSpec
from training.decode import encode
from training.models import DecoderAttn, EncoderDecoder


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
        self.input_names = list(decoder_inputs(spec))
        self.output_names = list(decoder_outputs(spec))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.input_names, inputs))
        if isinstance(self.decoder, DecoderAttn):
            return self.decoder.step(
                feed["decoder_input"], feed["hidden"], feed["keys_t"], feed["values"], feed["source_mask"]
            )
        return self.decoder.step(feed["decoder_input"], feed["hidden"])
