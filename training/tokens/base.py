"""What every token model (recurrent or transformer) offers the trainer, the export wrappers and the parity checks.

    encode(source (N, L), lengths (N,)) -> {name: tensor}: every entry of `contract.token_decoder_state(spec)`
                                           (what the first step reads) plus `memory`
    step(previous (N,), state)          -> log_probs (N, V), the next state (same names), alphas (N, L) | None
    forward(source, lengths, target_in) -> log_probs (N, T, V), teacher-forced

Everything else (greedy decoding, the numpy step function the runtime's search strategies drive) is written once,
here, over `encode` and `step`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from runtime.contract import token_decoder_state
from runtime.search.step import StepResult
from runtime.spec import ModelSpec
from runtime.vocab import BOS as BOS_ID
from runtime.vocab import EOS as EOS_ID
from runtime.vocab import PAD as PAD_ID

# Added to the logits of <pad> and <s>: exp(-1e4) is 0 in float32, and unlike -inf it keeps parity diffs finite.
NEVER_LOGIT = -1e4
TensorState = dict[str, torch.Tensor]

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "NEVER_LOGIT", "TokenModel", "never_output", "torch_steps"]


def never_output(vocab_size: int) -> torch.Tensor:
    """(V,) zeros with NEVER_LOGIT at <pad> and <s>: added to the logits so no search or sampler emits them."""
    never = torch.zeros(vocab_size)
    never[[PAD_ID, BOS_ID]] = NEVER_LOGIT
    return never


class TokenModel(nn.Module):
    """Base of the token models: subclasses implement `encode`, `step` and `forward` (see the module docstring)."""

    spec: ModelSpec

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> TensorState:
        raise NotImplementedError

    def step(self, previous: torch.Tensor,
             state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        raise NotImplementedError

    @torch.no_grad()
    def greedy(self, source: torch.Tensor, lengths: torch.Tensor, max_len: int) -> list[list[int]]:
        """The PyTorch reference greedy decode: token ids per input, without BOS and EOS."""
        state = self.encode(source, lengths)
        previous = torch.full((source.shape[0],), BOS_ID, dtype=torch.long)
        out: list[list[int]] = [[] for _ in range(source.shape[0])]
        done = torch.zeros(source.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            log_probs, state, _ = self.step(previous, state)
            previous = log_probs.argmax(dim=-1)
            for i in torch.nonzero(~done & (previous != EOS_ID)).flatten().tolist():
                out[i].append(int(previous[i]))
            done |= previous == EOS_ID
            if bool(done.all()):
                break
        return out


def torch_steps(model: TokenModel, source: np.ndarray, lengths: np.ndarray) -> tuple[dict, Callable]:
    """The PyTorch reference as (state, step function) for `runtime.search`: the same strategies then drive
    PyTorch and onnxruntime, so any difference between them is the graphs'."""
    with torch.no_grad():
        enc = model.encode(torch.from_numpy(source), torch.from_numpy(lengths))
    state = {name: enc[name].numpy() for name in token_decoder_state(model.spec)}  # exactly what a step reads

    def step(tokens: np.ndarray, state: dict) -> StepResult:
        feed = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
        with torch.no_grad():
            log_probs, new, alphas = model.step(torch.from_numpy(tokens.astype(np.int64)), feed)
        return StepResult(log_probs.numpy(), {k: new[k].numpy() for k in state},
                          None if alphas is None else alphas.numpy())

    return state, step
