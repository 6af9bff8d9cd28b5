"""A token model's graphs as the search strategies drive them: `TokenSteps`.

The encoder session turns padded source ids into the decoder state; the step session advances it one token. Inputs
are fed by the contract's names, and step outputs are fed back by `contract.FEEDBACK`, so the same code drives any
token model whose graphs follow the contract: a recurrent model's hidden_out/cell_out go back as hidden/cell; a
transformer's next_positions go back as positions and its grown self-attention cache as its past. The step's
`alphas` (N, Ls) become the StepResult's attention. Where an export has them, a transformer's fast and wide graphs,
its greedy loop and beam graph decode in one call, each picked by how many rows or inputs it decodes.
"""
from __future__ import annotations

import copy
from typing import Any, NamedTuple

import numpy as np

from runtime.search.step import BatchAxes, Hypothesis, State, StepResult

from .binding import Runner, runner
from .contract import BATCH, FAST_FILES, Dims
from .declared import TokenContract
from .errors import InputError
from .fused import BeamGraph, GreedyLoop
from .optional_graphs import fast_feedback, fast_graph_io, fold_tokens
from .points import Cancel, stoppable
from .spec import ModelSpec

PREVIOUS = "previous_tokens"  # the step input that takes the previous token
# Rows from which a transformer's wide graphs (batched MatMul attention) beat the fused-kernel ones (CPU, dates
# transformer, 1 thread: greedy and beam graphs break even at 4-6 rows): onnxruntime's attention kernels cost
# ~1-2 us per (row, head) pair.
WIDE_ROWS = 6
# Inputs from which the wide loop graphs beat the fast ones, where rows come in blocks (export.tokens.attention):
# the fast beam graph's attention kernels loop over (input, head) pairs, an input's k beams one block (dates
# transformer, 1 thread: beam 5 at 1-16 inputs 0.90-0.96x the wide graph's time, level at 32-64; beam 2 level at
# ~12); the wide greedy loop pads the batch to blocks of 4 inputs (0.98x the fast loop's time at 8, 0.77x at 16).
WIDE_GREEDY_INPUTS, WIDE_BEAM_INPUTS = 8, 16
# ... and for an int8 export's beam graphs, whose wide one multiplies in int8 and the others in float32 (Net.widen) up
# to export.tokens.int8.WIDEN_UP_TO (past it in int8 too: 32000 target ids, d_model 128, beam 5, 32 tokens, wide
# against fast_beam 0.99x the time at 2 inputs, 0.97x at 4, 0.93-0.96x at 8): dates transformer, beam 5, Intel Xeon,
# bare runs (one or two each): the wide graph against the plain one at 40 tokens 1.19x the time at 1 input, 1.09-1.10x
# at 2, 1.01x at 3, 0.93x at 4, 0.89x at 8; at 13 tokens 1.09x at 3, 1.02x at 4, 0.95x at 6. Through translate_batch,
# 41-character texts, 0.984x at 4 and 0.988x at 8 the time of the int8 plain graph it replaced there.
WIDE_BEAM_INPUTS_INT8 = 4
# The widest beam the beam graphs run: an input's k beams read k * t cache slots each step through their ancestry
# mask, k times the attention's arithmetic, so past 32 the step loop's beam search is faster (dates transformer,
# batch 1-4, 40 tokens: the graph 0.66x its time at beam 16, 0.82x at 32, 1.06-1.09x at 64, 1.40x at 128).
MAX_GRAPH_BEAM = 32
# The most inputs a folded call runs fold_few_beam for (its loop in segments, no If a step), where the export has it:
# dates transformer, beam 5, eos free, against fold_beam (`loop_graph_ab.py`, both ways): ~5% faster at 1 input
# (~6% at 20 forced tokens), ~2% at 2, 6-8% slower at 3 and 5-8% at 4 (export.tokens.beam_body).
FEW_BEAM_INPUTS = 2


class TokenSteps:
    """Encode once with the encoder session, then step with the step session; sessions are thread-safe.

    `step_inputs` and `feedback` say what the step reads and which of its outputs go back as which inputs: the
    contract's (`graph_io`, `FEEDBACK`) for the traced graphs, or a transformer's fast graphs' (`fast_graph_io`,
    `fast_feedback`). `fast`: the same model's fast twin, which `translate` decodes with when it can (no
    attention asked for). A greedy loop that reads the sources itself (the fast one) encodes inside its one call."""

    def __init__(self, spec: ModelSpec, encoder: Runner, step: Runner, greedy: GreedyLoop | None = None,
                 step_inputs: dict[str, Dims] | None = None, feedback: dict[str, str] | None = None,
                 fast: "TokenSteps | None" = None, beam: BeamGraph | None = None,
                 wide: "Graphs | None" = None, beam_step: Runner | None = None,
                 contract: TokenContract | None = None, folded: "FoldedGraphs | None" = None,
                 wide_beam_inputs: int = WIDE_BEAM_INPUTS) -> None:
        self.contract = contract_for(spec, contract)  # special ids, how sources are read, limits
        inputs = self.contract.step["inputs"] if step_inputs is None else step_inputs
        self.spec = spec
        self._encoder, self._step = encoder, step  # runners: typed errors; with IO binding, state on the device
        self.greedy = greedy  # the greedy loop graph, when the export has one and it is switched on
        self.fast = fast
        self.beam = beam  # the beam search graph (a transformer's fast graphs), or None
        self._beam_step = beam_step  # a recurrent model's beam step (constant context once per input), or None
        self.wide = wide  # a step, greedy loop and beam graph over the same state, for many rows
        self.folded = folded  # the one-call graphs with the cross-attention folded, for calls of few source tokens
        self.always_wide = False  # a view (`only`) that runs the wide graphs whatever the rows
        self.wide_beam_inputs = wide_beam_inputs  # inputs from which beam_graph picks the wide graph
        self.feedback = self.contract.feedback if feedback is None else feedback
        self.state_names = [name for name in inputs if name != PREVIOUS]
        self.batch_axes: BatchAxes = {name: inputs[name].index(BATCH) for name in self.state_names}
        # What a step reads but never feeds back (memory, keys, masks, cross-attention keys/values): beam search
        # expands it once per beam instead of reordering it every step.
        self.constant = frozenset(self.state_names) - frozenset(self.feedback.values())
        self.checked_options: dict[tuple, tuple] = {}  # option sets that passed (decode_options.translate_options)

    def encode(self, source_ids: np.ndarray, source_lengths: np.ndarray, cancel: Cancel | None = None) -> State:
        """ids (N, L) int64 right-padded, lengths (N,) int64 -> the state the first step reads; with `cancel`, the
        run is watched (a large batch's encoder runs for seconds) and stops with Cancelled when it says so."""
        produced = self._encoder({"source_ids": source_ids, "source_lengths": source_lengths}, cancel)
        return {name: produced[name] for name in self.state_names}

    def step(self, tokens: np.ndarray, state: State) -> StepResult:
        """One decoder step for every row: the StepFn the strategies drive."""
        return self._run_step(self.step_graph(len(tokens)), tokens, state)

    @property
    def has_beam_step(self) -> bool:
        """Whether `beam_step` can run: the export has a beam step graph."""
        return self._beam_step is not None

    def beam_step(self, tokens: np.ndarray, state: State) -> StepResult:
        """One step over beam search's rows (batch x beam, k consecutive rows per input) where the `constant`
        entries hold one row per input: beam_search(..., per_input=True) drives it."""
        return self._run_step(self._beam_step, tokens, state)

    def _run_step(self, run: Runner, tokens: np.ndarray, state: State) -> StepResult:
        feed = {PREVIOUS: tokens.astype(np.int64, copy=False), **state}
        result = run(feed)
        fed_back = {self.feedback[name]: value for name, value in result.items() if name in self.feedback}
        return StepResult(result["log_probs"], {**state, **fed_back}, result.get("alphas"))

    def _wide(self, count: int, threshold: int) -> bool:
        """Whether the wide graphs decode `count` rows or inputs faster (from `threshold` up)."""
        return self.wide is not None and (self.always_wide or count >= threshold)

    def step_graph(self, rows: int) -> Runner:
        """The step graph that decodes `rows` rows (batch x beam) fastest: the wide one from WIDE_ROWS up."""
        return self.wide.step if self._wide(rows, WIDE_ROWS) else self._step

    def _folds(self, inputs: int, source_len: int) -> bool:
        """Whether the folded graphs decode `inputs` sources of `source_len` (padded) tokens: at most up_to in all."""
        return self.folded is not None and inputs * source_len <= self.folded.up_to

    def greedy_loop(self, inputs: int, source_len: int) -> GreedyLoop | None:
        """The greedy loop graph that decodes `inputs` inputs of `source_len` tokens fastest (the wide one from
        WIDE_GREEDY_INPUTS up, else the folded one where they fold), or None without one."""
        if self._wide(inputs, WIDE_GREEDY_INPUTS):
            return self.wide.greedy
        return self.folded.greedy if self._folds(inputs, source_len) else self.greedy

    def beam_graph(self, inputs: int, source_len: int, beam_size: int) -> BeamGraph | None:
        """The beam search graph that decodes `inputs` inputs of `source_len` tokens fastest (the wide one from
        wide_beam_inputs up, else the folded one where they fold: fold_few_beam's for at most FEW_BEAM_INPUTS
        inputs), or None without one or for a beam wider than MAX_GRAPH_BEAM (the step loop's search is faster
        there)."""
        if beam_size > MAX_GRAPH_BEAM:
            return None
        if self._wide(inputs, self.wide_beam_inputs):
            return self.wide.beam
        if not self._folds(inputs, source_len):
            return self.beam
        few = self.folded.few_beam
        return few if few is not None and inputs <= FEW_BEAM_INPUTS else self.folded.beam

    def only(self, wide: bool) -> "TokenSteps":
        """A view that always runs the wide graphs (wide) or never does (for parity tools)."""
        view = copy.copy(self)
        view.wide, view.always_wide = (self.wide, True) if wide else (None, False)
        return view

    def greedy_tokens(self, source_ids: np.ndarray, source_lengths: np.ndarray, max_length: int, min_length: int,
                      return_attention: bool, cancel: Cancel | None = None) -> list[Hypothesis]:
        """The greedy loop graph's decode (it must exist): encoder first, or inside the loop graph's one call;
        `cancel` is watched while the loop runs."""
        greedy = self.greedy_loop(*source_ids.shape)
        if greedy.reads_sources:
            state, tokens = {"source_ids": source_ids, "source_lengths": source_lengths}, greedy.tokens
        else:  # two graphs: cancel is asked between them too (the watchdog asks a run only from a poll into it)
            state = self.encode(source_ids, source_lengths, cancel)
            tokens = greedy.tokens if cancel is None else stoppable(greedy.tokens, cancel)
        return tokens(state, max_length, min_length, return_attention, cancel)


class FoldedGraphs(NamedTuple):
    """The one-call graphs with the cross-attention folded (export.tokens.fold): picked in Python per call, for
    calls of at most `up_to` source tokens in all (an If inside one graph cost ~2.6% of a greedy batch-1 call)."""

    greedy: GreedyLoop
    beam: BeamGraph
    up_to: int
    few_beam: BeamGraph | None = None  # fold_few_beam: calls of at most FEW_BEAM_INPUTS inputs (none in older exports)


class Graphs(NamedTuple):
    """One variant's graphs over a shared state: the step, and the greedy loop and beam search graphs (or None)."""

    step: Runner
    greedy: GreedyLoop | None = None
    beam: BeamGraph | None = None


def contract_for(spec: ModelSpec, contract: TokenContract | None = None) -> TokenContract:
    """`contract`, or the one seq2onnx's own model of `spec` follows (a declared model's is its manifest's)."""
    if contract is not None:
        return contract
    if spec.is_declared:
        raise InputError("a declared model's contract comes from its manifest: pass the model's contract "
                         "(Seq2Seq.contract)")
    return TokenContract.for_spec(spec)


def fast_steps(spec: ModelSpec, sessions: dict[str, Any], bind: bool, device_id: int,
                int8: bool = False) -> TokenSteps | None:
    """A transformer's fast graphs as TokenSteps (with their greedy loop when loaded), or None without them; int8:
    the wide beam graph from WIDE_BEAM_INPUTS_INT8 inputs."""
    if FAST_FILES["step"] not in sessions:
        return None
    io = fast_graph_io(spec)
    feedback = fast_feedback(spec)

    def run(role: str, keep: set[str]) -> Runner:
        name = FAST_FILES[role]
        return runner(sessions[name], list(io[role]["outputs"]), name, bind, keep, device_id)

    def greedy(role: str) -> GreedyLoop | None:
        return GreedyLoop(spec, run(role, set()), io[role]) if FAST_FILES[role] in sessions else None

    def beam(role: str) -> BeamGraph | None:
        return BeamGraph(run(role, set())) if FAST_FILES[role] in sessions else None

    wide = (Graphs(run("wide_step", set(feedback)), greedy("wide_greedy"), beam("wide_beam"))
            if FAST_FILES["wide_step"] in sessions else None)
    folded = (FoldedGraphs(greedy("fold_greedy"), beam("fold_beam"), fold_tokens(spec), beam("fold_few_beam"))
              if {FAST_FILES["fold_greedy"], FAST_FILES["fold_beam"]} <= set(sessions) else None)
    return TokenSteps(spec, run("encoder", set(io["encoder"]["outputs"])), run("step", set(feedback)),
                      greedy("greedy"), io["step"]["inputs"], feedback, beam=beam("beam"), wide=wide, folded=folded,
                      wide_beam_inputs=WIDE_BEAM_INPUTS_INT8 if int8 else WIDE_BEAM_INPUTS)
