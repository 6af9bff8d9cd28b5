"""Token models in the runtime: the graphs as a step function, and `Seq2Seq.translate_batch` over it (texts in,
n-best translations out: greedy, beam or sampling).

`TokenSteps`: the encoder session turns padded source ids into the decoder state; the step session advances it one
token. Inputs are fed by the contract's names, and step outputs are fed back by `contract.FEEDBACK`, so the same
code drives any token model whose graphs follow the contract: a recurrent model's hidden_out/cell_out go back as
hidden/cell; a transformer's next_positions go back as positions and its grown self-attention cache
present_keys/present_values (layers, N, heads, t + 1, head_dim) as past_keys/past_values. The step's `alphas`
(N, Ls) become the StepResult's attention: a transformer's last decoder layer's cross-attention, mean over heads.

`translate`'s options follow CTranslate2's `translate_batch`: `beam_size` (1 = greedy), `num_hypotheses`,
`length_penalty` (score = sum of log-probs / length ** length_penalty, length counting the eos),
`max_decoding_length`, `min_decoding_length`, `sampling_topk` (1 = no sampling, 0 = the whole distribution),
`sampling_topp`, `sampling_temperature`, `seed`, `return_attention`. Sampling needs `beam_size` 1.

A transformer has a position table of `spec.max_positions` rows: source token i reads row i and output token t
row t, so longer sources and a larger `max_decoding_length` are refused rather than read past the table.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from runtime.search.step import BatchAxes, Hypothesis, State, StepResult, check_int

from .binding import Runner
from .contract import BATCH, VOCAB_FILES, Dims
from .declared import TokenContract
from .errors import InputError, IntegrityError, brief
from .fused import BeamGraph, GreedyLoop
from .manifest import Manifest, read_regular_file, sha256_bytes
from .points import Cancel, stoppable
from .search import beam_search, greedy_search, sample
from .search.beam import MAX_BEAM, check_beam
from .spec import ModelSpec
from .vocab import VocabError, Vocabulary

MAX_VOCAB_BYTES = 64 << 20
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
# The widest beam the beam graphs run: an input's k beams read k * t cache slots each step through their ancestry
# mask, k times the attention's arithmetic, so past 32 the step loop's beam search is faster (dates transformer,
# batch 1-4, 40 tokens: the graph 0.66x its time at beam 16, 0.82x at 32, 1.06-1.09x at 64, 1.40x at 128).
MAX_GRAPH_BEAM = 32
TRANSLATE_OPTIONS = ("beam_size", "num_hypotheses", "length_penalty", "max_decoding_length", "min_decoding_length",
                     "sampling_topk", "sampling_topp", "sampling_temperature", "seed", "return_attention")


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
                 contract: TokenContract | None = None) -> None:
        self.contract = contract_for(spec, contract)  # special ids, how sources are read, limits
        inputs = self.contract.step["inputs"] if step_inputs is None else step_inputs
        self.spec = spec
        self._encoder, self._step = encoder, step  # runners: typed errors; with IO binding, state on the device
        self.greedy = greedy  # the greedy loop graph, when the export has one and it is switched on
        self.fast = fast
        self.beam = beam  # the beam search graph (a transformer's fast graphs), or None
        self._beam_step = beam_step  # a recurrent model's beam step (constant context once per input), or None
        self.wide = wide  # a step, greedy loop and beam graph over the same state for `wide_rows` rows and more
        self.wide_rows, self.wide_greedy_inputs, self.wide_beam_inputs = WIDE_ROWS, WIDE_GREEDY_INPUTS, WIDE_BEAM_INPUTS
        self.feedback = self.contract.feedback if feedback is None else feedback
        self.state_names = [name for name in inputs if name != PREVIOUS]
        self.batch_axes: BatchAxes = {name: inputs[name].index(BATCH) for name in self.state_names}
        # What a step reads but never feeds back (memory, keys, masks, cross-attention keys/values): beam search
        # expands it once per beam instead of reordering it every step.
        self.constant = frozenset(self.state_names) - frozenset(self.feedback.values())

    def encode(self, source_ids: np.ndarray, source_lengths: np.ndarray) -> State:
        """ids (N, L) int64 right-padded, lengths (N,) int64 -> the state the first step reads."""
        produced = self._encoder({"source_ids": source_ids, "source_lengths": source_lengths})
        return {name: produced[name] for name in self.state_names}

    def step(self, tokens: np.ndarray, state: State) -> StepResult:
        """One decoder step for every row: the StepFn the strategies drive."""
        return self._run_step(self.graphs(len(tokens)).step, tokens, state)

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

    def graphs(self, rows: int) -> "Graphs":
        """The graphs that decode `rows` rows (batch x beam) fastest: the wide ones from `wide_rows` up."""
        if self.wide is not None and rows >= self.wide_rows:
            return self.wide
        return Graphs(self._step, self.greedy, self.beam)

    def greedy_loop(self, inputs: int) -> GreedyLoop | None:
        """The greedy loop graph that decodes `inputs` inputs fastest (the wide one from `wide_greedy_inputs` up), or
        None without one."""
        if self.wide is not None and inputs >= self.wide_greedy_inputs:
            return self.wide.greedy
        return self.greedy

    def beam_graph(self, inputs: int, beam_size: int) -> BeamGraph | None:
        """The beam search graph that decodes `inputs` inputs fastest (the wide one from `wide_beam_inputs` up), or
        None without one or for a beam wider than MAX_GRAPH_BEAM (the step loop's search is faster there)."""
        if beam_size > MAX_GRAPH_BEAM:
            return None
        if self.wide is not None and inputs >= self.wide_beam_inputs:
            return self.wide.beam
        return self.beam

    def only(self, wide: bool) -> "TokenSteps":
        """A view that always runs the wide graphs (wide) or never does (for parity tools)."""
        view = copy.copy(self)
        view.wide, view.wide_rows, view.wide_greedy_inputs, view.wide_beam_inputs = (self.wide, 1, 1, 1) if wide \
            else (None, WIDE_ROWS, WIDE_GREEDY_INPUTS, WIDE_BEAM_INPUTS)
        return view

    def greedy_tokens(self, source_ids: np.ndarray, source_lengths: np.ndarray, max_length: int, min_length: int,
                      return_attention: bool, cancel: Cancel | None = None) -> list[Hypothesis]:
        """The greedy loop graph's decode (it must exist): encoder first, or inside the loop graph's one call;
        `cancel` is watched while the loop runs."""
        greedy = self.greedy_loop(len(source_ids))
        sources = {"source_ids": source_ids, "source_lengths": source_lengths}
        reads_sources = set(sources) <= set(greedy.inputs)
        state = sources if reads_sources else self.encode(source_ids, source_lengths)
        return greedy.tokens(state, max_length, min_length, return_attention, cancel)


class Graphs(NamedTuple):
    """One variant's graphs over a shared state: the step, and the greedy loop and beam search graphs (or None)."""

    step: Runner
    greedy: GreedyLoop | None = None
    beam: BeamGraph | None = None


@dataclass(frozen=True)
class Translation:
    """One hypothesis: its text, target tokens and ids (no bos/eos), score, summed log-prob, attention (len, Ls).

    attention row t is output token t's weights over the source tokens (padding columns included, 0 there):
    the decoder's attention (multi-head: averaged over heads), or a transformer's last decoder layer's
    cross-attention averaged over heads."""

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None = None


def load_vocabularies(model_dir: Path, manifest: Manifest) -> dict[str, Vocabulary]:
    """Each side's vocabulary, read within bounds and checked against the manifest's sha256."""
    out = {}
    for side, entry in manifest.vocabularies.items():
        path = model_dir / VOCAB_FILES[side]
        data = read_regular_file(path, MAX_VOCAB_BYTES, IntegrityError, "vocabulary listed in the manifest is "
                                 "missing; re-export the model")
        if sha256_bytes(data) != entry["sha256"]:
            raise IntegrityError(f"{path}: sha256 does not match the manifest's; the file was altered, re-export "
                                 "the model")
        try:
            out[side] = Vocabulary.from_dict(json.loads(data.decode("utf-8")))
        except (ValueError, VocabError, RecursionError) as exc:
            raise IntegrityError(f"{path}: not a seq2onnx vocabulary ({exc}); re-export the model") from None
        out[side].check_usable()  # a subword vocabulary without `tokenizers` fails here, at load, not per request
    return out


def check_texts(texts: Any) -> list[str]:
    """A list of non-empty strings."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise InputError(f"texts: expected a list of strings, got {brief(texts)}; wrap one text as [text]")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"texts[{i}]: expected a non-empty string, got {brief(text)}")
    return list(texts)


def contract_for(spec: ModelSpec, contract: TokenContract | None = None) -> TokenContract:
    """`contract`, or the one seq2onnx's own model of `spec` follows (a declared model's is its manifest's)."""
    if contract is not None:
        return contract
    if spec.is_declared:
        raise InputError("a declared model's contract comes from its manifest: pass the model's contract "
                         "(Seq2Seq.contract)")
    return TokenContract.for_spec(spec)


def source_token_limit(spec: ModelSpec, contract: TokenContract | None = None) -> int:
    """The most source tokens (its specials included) a model reads: MAX_SOURCE_TOKENS, a transformer's
    max_positions, or a declared model's own bound."""
    return contract_for(spec, contract).sources.max_len


def too_long(n: int, spec: ModelSpec, contract: TokenContract | None = None) -> str:
    """Why `n` source tokens (specials included) are refused: the limit, and where it comes from."""
    limit = source_token_limit(spec, contract)
    if spec.is_declared:
        fixed = contract_for(spec, contract).sources.fixed_len is not None
        return (f"{n} tokens with its specials, more than the {limit} this model reads"
                f"{' (it was trained on sources of exactly that length)' if fixed else ''}")
    if spec.is_transformer and limit == spec.max_positions:
        return (f"{n} tokens with the closing </s>, more than this transformer's max_positions {limit} (source "
                "token i reads row i of its position table)")
    return f"{n} tokens with the closing </s>, more than the {limit} allowed"


def encode_sources(texts: list[str], vocab: Vocabulary, spec: ModelSpec,
                   contract: TokenContract | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (N, L) and lengths (N,) as the model was trained on them (its tokens, reversed where it
    was trained so, between the bos and eos it reads; padded to its fixed length if it has one), refusing over-long
    inputs by index."""
    rules = contract_for(spec, contract).sources
    ids, lengths = vocab.encode_batch(texts, add_bos=rules.add_bos, add_eos=rules.add_eos, reverse=rules.reverse)
    over = np.flatnonzero(lengths > rules.max_len)
    if over.size:
        i = int(over[0])
        raise InputError(f"texts[{i}]: {too_long(int(lengths[i]), spec, contract)}; split the text")
    if rules.fixed_len is not None and ids.shape[1] < rules.fixed_len:  # (N, fixed_len): what the encoder reads
        ids = np.pad(ids, ((0, 0), (0, rules.fixed_len - ids.shape[1])), constant_values=vocab.ids.filler)
    return ids, lengths


def check_decoding_length(spec: ModelSpec, max_decoding_length: Any, contract: TokenContract | None = None) -> int:
    """max_decoding_length (None: the spec's target_len) as an int >= 1 that the model can produce (a transformer:
    output token t reads row t of its position table, so at most max_positions tokens)."""
    default = max_decoding_length is None
    length = check_int("max_decoding_length", spec.target_len if default else max_decoding_length, 1)
    limit = contract_for(spec, contract).max_decoding_length
    if limit is not None and length > limit:
        given = f"the default, the spec's target_len {length}," if default else f"{length}"
        why = (f"this transformer's max_positions {limit} (output token t reads row t of its position table)"
               if spec.is_transformer else f"the {limit} tokens this model can produce")
        raise InputError(f"max_decoding_length: {given} is more than {why}; pass max_decoding_length <= {limit}")
    return length


def translate(steps: TokenSteps, vocabularies: dict[str, Vocabulary], texts: Any, beam_size: int = 1,
              num_hypotheses: int = 1, length_penalty: float = 1.0, max_decoding_length: int | None = None,
              min_decoding_length: int = 0, sampling_topk: int = 1,
              sampling_topp: float = 1.0, sampling_temperature: float = 1.0, seed: int | None = None,
              return_attention: bool = False, cancel: Cancel | None = None) -> list[list[Translation]]:
    """Encode the texts once, decode with the chosen strategy, and turn ids back into text. `cancel` is asked
    before every decoder step (a one-call graph, the greedy loop or the beam graph: before it, and while it runs):
    True stops with Cancelled."""
    texts = check_texts(texts)
    max_decoding_length = check_decoding_length(steps.spec, max_decoding_length, steps.contract)
    check_int("beam_size", beam_size, 1, MAX_BEAM)  # every option checked, even for no texts
    _, length_penalty = check_beam(beam_size, num_hypotheses, length_penalty)
    check_int("min_decoding_length", min_decoding_length, 0, max_decoding_length)
    if not isinstance(return_attention, bool):
        raise InputError(f"return_attention: expected True or False, got {brief(return_attention)}")
    sampling = sampling_topk != 1 or sampling_topp != 1.0 or sampling_temperature != 1.0
    if sampling and beam_size != 1:
        raise InputError(f"beam_size: sampling needs beam_size 1, got {brief(beam_size)}; drop the sampling "
                         "options for beam search")
    if steps.fast is not None and not return_attention:  # the fast graphs carry no attention weights
        steps = steps.fast
    if not texts:
        return []
    ids, lengths = encode_sources(texts, vocabularies["source"], steps.spec, steps.contract)
    step = steps.step if cancel is None else stoppable(steps.step, cancel)
    specials = steps.contract.specials
    common = dict(batch_size=len(texts), bos_id=specials.bos, eos_id=specials.eos,
                  min_decoding_length=min_decoding_length,
                  max_decoding_length=max_decoding_length, return_attention=return_attention,
                  constant=steps.constant)
    beam = steps.beam_graph(len(texts), beam_size)  # a transformer's beam search graph, or None
    if (beam_size != 1 or num_hypotheses != 1) and beam is not None:  # one call: the export's beam graph
        run = beam.hypotheses if cancel is None else stoppable(beam.hypotheses, cancel)  # asked before, watched in
        found = run(ids, lengths, beam_size, num_hypotheses, length_penalty, max_decoding_length,
                    min_decoding_length, cancel)
    elif beam_size != 1 or num_hypotheses != 1:  # with a beam step, what attention reads stays once per input
        fold = steps.has_beam_step
        step = steps.beam_step if fold else steps.step
        step = step if cancel is None else stoppable(step, cancel)
        found = beam_search(step, steps.encode(ids, lengths), steps.batch_axes, beam_size=beam_size,
                            num_hypotheses=num_hypotheses, length_penalty=length_penalty, per_input=fold, **common)
    elif sampling:
        found = [[h] for h in sample(step, steps.encode(ids, lengths), steps.batch_axes, seed=seed,
                                     sampling_temperature=sampling_temperature, sampling_topk=sampling_topk,
                                     sampling_topp=sampling_topp, **common)]
    elif steps.greedy is not None:  # one call (two where the encoder is its own graph): the greedy loop graph
        tokens = steps.greedy_tokens if cancel is None else stoppable(steps.greedy_tokens, cancel)
        found = [[h] for h in tokens(ids, lengths, max_decoding_length, min_decoding_length, return_attention,
                                     cancel)]
    else:
        found = [[h] for h in greedy_search(step, steps.encode(ids, lengths), steps.batch_axes, **common)]
    target = vocabularies["target"]
    return [[Translation(target.decode(h.tokens), [target.tokens[i] for i in h.tokens], list(h.tokens), h.score,
                         h.log_prob, h.attention) for h in hyps] for hyps in found]
