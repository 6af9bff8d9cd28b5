"""The PyTorch side of a token model's parity checks: seq2onnx's own models (`OwnModel`) and declared ones
(`AdaptedModel`) behind one face, so export and `verify` check both the same way: (state, step) for
`runtime.search` over the same ids the runtime decodes, the contract the runtime follows, random sources laid out as
the model reads them, and a declared model's own decode."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from export.adapted import Adapted, random_sources
from export.adapted_modules import AdaptedEncoder, AdaptedStep
from export.tracing import run_declared
from runtime.declared import TokenContract
from runtime.search import StepResult
from runtime.spec import ModelSpec
from runtime.vocab import EOS, PAD
from training.tokens.base import TokenModel, torch_steps

StepFn = Callable[[np.ndarray, dict], StepResult]


def token_batch(spec_vocab: int, n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random right-padded ids (n, length) and lengths (n,), with real lengths varying inside the batch (seq2onnx's
    own vocabularies: no specials inside the sources)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, size=n).astype(np.int64)
    ids = rng.integers(EOS + 2, spec_vocab, size=(n, length)).astype(np.int64)  # no specials inside sources
    ids[np.arange(length)[None, :] >= lengths[:, None]] = PAD
    return ids, lengths


@dataclass(frozen=True)
class OwnModel:
    """A seq2onnx token model (recurrent or transformer) on the PyTorch side."""

    model: TokenModel

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def contract(self) -> TokenContract:
        return TokenContract.for_spec(self.model.spec)

    def steps(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[dict, StepFn]:
        return torch_steps(self.model, ids, lengths)

    def sources(self, n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        length = min(length, self.spec.max_positions) if self.spec.is_transformer else length
        return token_batch(self.spec.source_vocab_size, n, length, seed)

    reference = None  # its own decode is the search driven by `steps`


@dataclass(frozen=True)
class AdaptedModel:
    """A declared model on the PyTorch side: its encode and step as exported (AdaptedEncoder/AdaptedStep: scores
    as log-probs, never-emitted ids at -inf), and its own decode as the reference."""

    adapted: Adapted

    @property
    def spec(self) -> ModelSpec:
        return self.adapted.spec

    @property
    def contract(self) -> TokenContract:
        return self.adapted.contract

    @property
    def reference(self) -> Any:
        adapter = self.adapted.adapter
        if adapter.reference is None:
            return None
        # the user's own decode: a failure inside is an AdapterError naming it (and the module it happened in)
        return lambda *args: run_declared(adapter, "reference", adapter.reference, *args)

    def steps(self, ids: np.ndarray, lengths: np.ndarray) -> tuple[dict, StepFn]:
        adapter, contract = self.adapted.adapter, self.contract
        encoder, step = AdaptedEncoder(adapter), AdaptedStep(adapter, contract.has_attention)
        with torch.no_grad():
            state = dict(zip(encoder.output_names, encoder(torch.from_numpy(ids), torch.from_numpy(lengths))))
        outputs = list(contract.step["outputs"])

        def run(tokens: np.ndarray, current: dict) -> StepResult:
            feed = [torch.from_numpy(np.ascontiguousarray(current[name])) for name in encoder.output_names]
            with torch.no_grad():
                produced = dict(zip(outputs, step(torch.from_numpy(tokens.astype(np.int64)), *feed)))
            fed = {into: produced[out].numpy() for out, into in contract.feedback.items()}
            attention = produced.get("alphas")
            return StepResult(produced["log_probs"].numpy(), {**current, **fed},
                              None if attention is None else attention.numpy())

        return {name: value.numpy() for name, value in state.items()}, run

    def sources(self, n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return declared_sources(self.contract, self.adapted.adapter.source_vocab, n, length, seed)


def declared_sources(contract: TokenContract, vocab: Any, n: int, length: int,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A declared model's random sources of about `length` tokens (its own width where it fixes one, within the
    most it reads), laid out as the runtime lays them out."""
    rules = contract.sources
    width = rules.fixed_len or min(max(length, 1) + int(rules.add_bos) + int(rules.add_eos), rules.max_len)
    return random_sources(rules, vocab, n, width, seed)


TorchSide = OwnModel | AdaptedModel


def side_of(model: Any) -> TorchSide:
    """The PyTorch side of what export or verify was given: a token model, or a probed adapter."""
    return AdaptedModel(model) if isinstance(model, Adapted) else OwnModel(model)
