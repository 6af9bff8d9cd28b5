"""A probed declared model's two functions as torch modules with flat tensor arguments, what the exporter traces:
the encoder (source_ids, source_lengths -> the state tensors) and one decoder step (previous_tokens and the state
-> log-probs, the changed state, the attention)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .adapter import Seq2SeqAdapter


class AdaptedEncoder(torch.nn.Module):
    """source_ids, source_lengths -> the declared state tensors, in declaration order."""

    def __init__(self, adapter: Seq2SeqAdapter) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(adapter.modules)  # the weights, as this module's own
        self.adapter = adapter
        self.output_names = list(adapter.state)

    def forward(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = self.adapter.encode(source_ids, source_lengths)
        return tuple(state[name] for name in self.output_names)


class AdaptedStep(torch.nn.Module):
    """previous_tokens and the state -> log_probs (log-softmax of logits; never-emitted ids at -inf), each changing
    state tensor's next value, and the attention when the model gives it."""

    def __init__(self, adapter: Seq2SeqAdapter, attention: bool) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(adapter.modules)
        self.adapter, self.attention = adapter, attention
        self.state_names = list(adapter.state)
        self.register_buffer("never", torch.tensor(sorted(adapter.never_emit), dtype=torch.int64), persistent=False)

    def forward(self, previous_tokens: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores, changed, attention = (*self.adapter.step(previous_tokens, dict(zip(self.state_names, state))),
                                      None)[:3]
        log_probs = F.log_softmax(scores, dim=-1) if self.adapter.scores == "logits" else scores
        if self.never.numel():
            log_probs = log_probs.index_fill(1, self.never, float("-inf"))
        return (log_probs, *(changed[name] for name in self.adapter.changing),
                *((attention,) if self.attention else ()))
