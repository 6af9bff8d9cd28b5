"""PyTorch eager for `seq2onnx bench --checkpoint`: the checkpoint's own model decoding the bench's inputs.

Decoders, each doing exactly the work the onnxruntime side does (texts -> ids by the runtime's own encoding):
    points             training.points.decode.reference_decode, target_len points
    tokens, beam 1     TokenModel.greedy, the PyTorch reference loop, with </s> forbidden so that every sequence
                       runs exactly target_len steps (what min_decoding_length = max_decoding_length does for the
                       runtime); also "torch_search": training.tokens.recurrent.torch_steps driven by runtime.search's
                       greedy_search, the strategy code onnxruntime runs, so only the graphs differ
    tokens, beam k     torch_steps driven by runtime.search.beam_search, min = max length
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from runtime.bench import Cell, Inputs
from runtime.contract import state_batch_axes
from runtime.search import beam_search, greedy_search
from runtime.tokens import encode_sources
from runtime.vocab import BOS, EOS
from training.checkpoint import load_checkpoint
from training.points.decode import reference_decode
from training.tokens.base import TensorState, TokenModel, torch_steps

from .verify import check_pair
from .weights import check_weights

REFERENCE = {"points": "training.points.decode.reference_decode", "greedy": "TokenModel.greedy (</s> forbidden)",
             "beam": "torch_steps + runtime.search.beam_search"}
SEARCH = "torch_steps + runtime.search.greedy_search"


class FixedLength(TokenModel):
    """A token model whose steps never pick </s>: its own greedy loop then runs exactly max_len steps."""

    def __init__(self, model: TokenModel) -> None:
        super().__init__()
        self.inner, self.spec = model, model.spec

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> TensorState:
        return self.inner.encode(source, lengths)

    def step(self, previous: torch.Tensor,
             state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        log_probs, state, alphas = self.inner.step(previous, state)
        log_probs[:, EOS] = float("-inf")  # (N, V): a fresh tensor of this step, not the model's
        return log_probs, state, alphas


class Eager:
    """A checkpoint's model, checked to be MODEL_DIR's, and the PyTorch decoders timed against onnxruntime."""

    def __init__(self, checkpoint: Path, model_dir: Path, runtime: Any) -> None:
        model, spec, _ = load_checkpoint(checkpoint)  # errors name the checkpoint: the caller shows them
        check_weights(model, f"checkpoint {Path(checkpoint).name}")  # a NaN weight: no n-best list to time
        check_pair(checkpoint, model_dir, spec, runtime)
        self.model, self.spec = model, spec
        self.vocab = runtime.vocabularies.get("source")
        self.fixed = FixedLength(model).eval() if spec.kind == "tokens" else None
        self.torch_version = str(torch.__version__)

    @staticmethod
    def set_threads(threads: int) -> None:
        """PyTorch's intra-op threads for the next cells (onnxruntime's are the session's)."""
        torch.set_num_threads(threads)

    def decoders(self, cell: Cell, inputs: Inputs) -> dict[str, tuple[str, Callable[[], int]]]:
        """{JSON key: (decoder name, call returning the output tokens)}; 'torch' is the one the speed-up uses."""
        if self.spec.kind == "points":
            return {"torch": (REFERENCE["points"], self._points(cell, inputs))}
        if cell.beam == 1:
            return {"torch": (REFERENCE["greedy"], self._greedy(cell, inputs)),
                    "torch_search": (SEARCH, self._search(cell, inputs))}
        return {"torch": (REFERENCE["beam"], self._search(cell, inputs))}

    def _points(self, cell: Cell, inputs: Inputs) -> Callable[[], int]:
        source, mask = torch.from_numpy(inputs.source), torch.from_numpy(inputs.mask)

        def run() -> int:
            with torch.inference_mode():
                outputs, _ = reference_decode(self.model, source, cell.target_len, mask)
            return int(outputs.shape[0] * outputs.shape[1])

        return run

    def _greedy(self, cell: Cell, inputs: Inputs) -> Callable[[], int]:
        def run() -> int:
            ids, lengths = encode_sources(list(inputs.texts), self.vocab, self.spec)
            with torch.inference_mode():
                found = self.fixed.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), cell.target_len)
            return sum(len(tokens) for tokens in found)

        return run

    def _search(self, cell: Cell, inputs: Inputs) -> Callable[[], int]:
        axes = state_batch_axes(self.spec)
        common = {"batch_size": len(inputs.texts), "bos_id": BOS, "eos_id": EOS,
                  "max_decoding_length": cell.target_len, "min_decoding_length": cell.target_len}

        def run() -> int:
            ids, lengths = encode_sources(list(inputs.texts), self.vocab, self.spec)
            with torch.inference_mode():
                state, step = torch_steps(self.model, ids, lengths)
                if cell.beam == 1:
                    return sum(len(h.tokens) for h in greedy_search(step, state, axes, **common))
                found = beam_search(step, state, axes, beam_size=cell.beam, **common)
            return sum(len(hyps[0].tokens) for hyps in found)

        return run

