"""Token graphs as a step function for the decoding strategies in `runtime.search`.

The encoder session turns padded source ids into the decoder state; the step session advances it one token.
Inputs are fed by the contract's names, and step outputs are fed back by `contract.FEEDBACK`, so the same code
drives any token model whose graphs follow the contract: a recurrent model's hidden_out/cell_out go back as
hidden/cell; a transformer's next_positions go back as positions and its grown self-attention cache
present_keys/present_values (layers, N, heads, t + 1, head_dim) as past_keys/past_values. The step's `alphas`
(N, Ls) become the StepResult's attention: a transformer's last decoder layer's cross-attention, mean over heads."""
from __future__ import annotations

import numpy as np

from .binding import Runner
from .contract import DECODER_STEP_FILE, FEEDBACK, graph_io, state_batch_axes
from .fused import GreedyLoop
from .search.step import BatchAxes, State, StepResult
from .spec import ModelSpec

PREVIOUS = "previous_tokens"


class TokenSteps:
    """Encode once with the encoder session, then step with the step session; sessions are thread-safe."""

    def __init__(self, spec: ModelSpec, encoder: Runner, step: Runner, greedy: GreedyLoop | None = None) -> None:
        io = graph_io(spec)
        self.spec = spec
        self._encoder, self._step = encoder, step  # runners: typed errors; with IO binding, state on the device
        self.greedy = greedy  # the greedy loop graph, when the export has one and it is switched on
        self.state_names = [name for name in io[DECODER_STEP_FILE]["inputs"] if name != PREVIOUS]
        self.batch_axes: BatchAxes = state_batch_axes(spec)

    def encode(self, source_ids: np.ndarray, source_lengths: np.ndarray) -> State:
        """ids (N, L) int64 right-padded, lengths (N,) int64 -> the state the first step reads."""
        produced = self._encoder({"source_ids": source_ids, "source_lengths": source_lengths})
        return {name: produced[name] for name in self.state_names}

    def step(self, tokens: np.ndarray, state: State) -> StepResult:
        """One decoder step for every row: the StepFn the strategies drive."""
        feed = {PREVIOUS: tokens.astype(np.int64, copy=False), **state}
        result = self._step(feed)
        fed_back = {FEEDBACK[name]: value for name, value in result.items() if name in FEEDBACK}
        return StepResult(result["log_probs"], {**state, **fed_back}, result.get("alphas"))
