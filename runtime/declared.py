"""A token model's contract as plain data: what its encoder and step graphs take and give, which step outputs feed
which step inputs, its special ids and how it reads sources. The runtime decodes any token model by this alone, so
seq2onnx's own models (`TokenContract.for_spec`) and a model a user declares (`export.adapter`) are instances of the
same thing; manifests carry it since format 2 (format 1 manifests get it from their spec).

    encoder  source_ids (batch, source_len or fixed), source_lengths (batch) -> the state, by name
    step     previous_tokens (batch) and the state -> log_probs (batch, V), each changing entry's next value,
             alphas (batch, source_len) when the model gives attention

Each state entry has one `batch` dim (its batch axis: beam search reorders and drops rows along it). An entry some
step output feeds back (`feedback`: output -> input) changes every step; the others are read unchanged (constant
context: memory, keys, masks). A dim `past_len` grows by one per step: the step's output has `present_len` there.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .contract import (
    BATCH,
    DECODE_LEN,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FEEDBACK,
    PAST_LEN,
    PRESENT_LEN,
    SOURCE_LEN,
    Dims,
    graph_io,
)
from .errors import Seq2OnnxError, brief, is_count
from .spec import ModelSpec
from .specials import FIXED, Specials, SpecialsError

PREVIOUS = "previous_tokens"
SOURCE_INPUTS = ("source_ids", "source_lengths")
MAX_SOURCE_TOKENS = 1024  # longer inputs are refused: attention memory grows with them, and no model here saw them
GraphDecl = dict[str, dict[str, Dims]]  # {"inputs": {name: dims}, "outputs": {name: dims}}


class ContractError(Seq2OnnxError, ValueError):
    """A token contract (declared, or read from a manifest) that no runtime could follow."""


@dataclass(frozen=True)
class Sources:
    """How the runtime turns a text into the encoder's ids: the tokens, reversed or not, between an optional bos
    and an optional eos; `fixed_len`: the encoder reads exactly this many tokens, so every batch is padded to it
    (longer texts are refused); `max_len`: the most tokens a source may hold, specials included."""

    add_bos: bool = False
    add_eos: bool = True
    reverse: bool = False
    fixed_len: int | None = None
    max_len: int = MAX_SOURCE_TOKENS

    def __post_init__(self) -> None:
        for name in ("add_bos", "add_eos", "reverse"):
            if not isinstance(getattr(self, name), bool):
                raise ContractError(f"sources.{name} must be true or false, got {brief(getattr(self, name))}")
        for name, value in (("fixed_len", self.fixed_len), ("max_len", self.max_len)):
            if value is not None and not is_count(value, 1):
                raise ContractError(f"sources.{name} must be an int >= 1{' or None' * (name == 'fixed_len')}, "
                                    f"got {brief(value)}")
        if self.fixed_len is not None and self.max_len != self.fixed_len:
            object.__setattr__(self, "max_len", min(self.max_len, self.fixed_len))


SOURCE_KEYS = frozenset(f.name for f in fields(Sources))


@dataclass(frozen=True)
class TokenContract:
    """See the module docstring. `never`: target ids the step never emits (their log-prob is -inf in a declared
    model's graph, -1e4 in seq2onnx's own; beam search and sampling never return them); `max_decoding_length`: the
    most output tokens the model can produce (a transformer's position table), None for any number."""

    encoder: GraphDecl
    step: GraphDecl
    feedback: dict[str, str]
    specials: Specials
    sources: Sources = field(default_factory=Sources)
    never: tuple[int, ...] = ()
    max_decoding_length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "never", tuple(self.never))
        self._check_encoder()
        self._check_step()
        self._check_feedback()

    # -- what the runtime reads --------------------------------------------------------------------------------

    @property
    def state(self) -> dict[str, Dims]:
        """What a step reads besides the previous token, by name."""
        return {name: dims for name, dims in self.step["inputs"].items() if name != PREVIOUS}

    @property
    def batch_axes(self) -> dict[str, int]:
        return {name: dims.index(BATCH) for name, dims in self.state.items()}

    @property
    def constant(self) -> frozenset[str]:
        """State a step reads but never feeds back: beam search expands it once, never reorders it."""
        return frozenset(self.state) - frozenset(self.feedback.values())

    @property
    def has_attention(self) -> bool:
        return "alphas" in self.step["outputs"]

    @property
    def target_vocab_size(self) -> int:
        return self.step["outputs"]["log_probs"][1]

    def graph_io(self) -> dict[str, GraphDecl]:
        """The encoder and step graphs' declared inputs and outputs, keyed by file name."""
        return {ENCODER_FILE: self.encoder, DECODER_STEP_FILE: self.step}

    def greedy_io(self) -> GraphDecl:
        """The greedy loop graph around the step: the encoder's state, max_length and min_length in; tokens
        (0 after a row's eos), their log-probs and alphas out."""
        out: dict[str, Dims] = {"tokens": [BATCH, DECODE_LEN], "token_log_probs": [BATCH, DECODE_LEN]}
        if self.has_attention:
            out["alphas"] = [BATCH, DECODE_LEN, self.step["outputs"]["alphas"][1]]
        return {"inputs": {**self.state, "max_length": [], "min_length": []}, "outputs": out}

    # -- checks ----------------------------------------------------------------------------------------------

    def _check_encoder(self) -> None:
        length = SOURCE_LEN if self.sources.fixed_len is None else self.sources.fixed_len
        want = {"source_ids": [BATCH, length], "source_lengths": [BATCH]}
        _check_graph(self.encoder, "encoder")
        if self.encoder["inputs"] != want:
            raise ContractError(f"encoder inputs must be {want}, got {self.encoder['inputs']}")

    def _check_step(self) -> None:
        _check_graph(self.step, "step")
        inputs, outputs = self.step["inputs"], self.step["outputs"]
        if inputs.get(PREVIOUS) != [BATCH]:
            raise ContractError(f"step input {PREVIOUS!r} must be [{BATCH!r}], got {brief(inputs.get(PREVIOUS))}")
        made = self.encoder["outputs"]
        for name, dims in self.state.items():
            if dims.count(BATCH) != 1:
                raise ContractError(f"state {name!r} must have exactly one {BATCH!r} dim (its batch axis), got "
                                    f"{dims}")
            if name not in made:
                raise ContractError(f"state {name!r} is read by the step but the encoder does not make it; encoder "
                                    f"outputs: {sorted(made)}")
            if len(made[name]) != len(dims) or not all(m == d or (d == PAST_LEN and is_count(m, 0))
                                                       for m, d in zip(made[name], dims)):
                raise ContractError(f"state {name!r}: the encoder makes {made[name]}, the step reads {dims} (a "
                                    f"{PAST_LEN!r} dim starts at a fixed size)")
        vocab = outputs.get("log_probs")
        if vocab is None:
            raise ContractError(f"the step has no output 'log_probs' (the scores the search reads); its outputs: "
                                f"{sorted(outputs)}")
        if not (isinstance(vocab, list) and len(vocab) == 2 and vocab[0] == BATCH and is_count(vocab[1], 2)):
            raise ContractError(f"step output 'log_probs' must be [{BATCH!r}, vocabulary size >= 2], got "
                                f"{brief(vocab)}")
        alphas = outputs.get("alphas")
        if alphas is not None and alphas != [BATCH, self.encoder["inputs"]["source_ids"][1]]:
            raise ContractError(f"step output 'alphas' must be [{BATCH!r}, source length], got {brief(alphas)}")
        try:
            self.specials.check_fits(self.target_vocab_size, "target vocabulary")
        except SpecialsError as err:
            raise ContractError(str(err)) from None
        bad = [i for i in self.never if not is_count(i, 0) or i >= self.target_vocab_size or i == self.specials.eos]
        if bad:
            raise ContractError(f"never-emitted ids must be target ids other than eos, got {brief(bad)}")
        if self.max_decoding_length is not None and not is_count(self.max_decoding_length, 1):
            raise ContractError(f"max_decoding_length must be an int >= 1 or None, got "
                                f"{brief(self.max_decoding_length)}")

    def _check_feedback(self) -> None:
        inputs, outputs = self.step["inputs"], self.step["outputs"]
        for out, into in self.feedback.items():
            if out not in outputs or into not in self.state:
                raise ContractError(f"feedback {out!r} -> {into!r}: needs a step output and a state input; "
                                    f"outputs {sorted(outputs)}, state {sorted(self.state)}")
            grown = [PRESENT_LEN if d == PAST_LEN else d for d in inputs[into]]
            if outputs[out] != grown:
                raise ContractError(f"step output {out!r} feeds {into!r} back but is {outputs[out]}, where "
                                    f"{into!r} is {inputs[into]} (a past_len dim comes back as present_len)")
        if len(set(self.feedback.values())) != len(self.feedback):
            raise ContractError(f"feedback must feed each state input once, got {self.feedback}")
        extra = sorted(set(outputs) - {"log_probs", "alphas"} - set(self.feedback))
        if extra:
            raise ContractError(f"step outputs {extra} feed nothing back; name them in feedback or drop them")

    # -- storage -------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"encoder": self.encoder, "step": self.step, "feedback": dict(self.feedback),
                "specials": self.specials.to_dict(), "never": list(self.never),
                "sources": {"add_bos": self.sources.add_bos, "add_eos": self.sources.add_eos,
                            "reverse": self.sources.reverse, "fixed_len": self.sources.fixed_len,
                            "max_len": self.sources.max_len},
                "max_decoding_length": self.max_decoding_length}

    @classmethod
    def from_dict(cls, data: Any) -> "TokenContract":
        """Rebuild and check a contract, refusing unknown or missing keys by name."""
        keys = {"encoder", "step", "feedback", "specials", "never", "sources", "max_decoding_length"}
        if not isinstance(data, dict) or set(data) != keys:
            got = sorted(data) if isinstance(data, dict) else brief(data)
            raise ContractError(f"contract must be an object with exactly {sorted(keys)}, got {got}")
        try:
            specials = Specials.from_dict(data["specials"])
            sources = data["sources"]
            if not isinstance(sources, dict):
                raise ContractError(f"sources must be an object, got {brief(sources)}")
            unknown = sorted(set(sources) - SOURCE_KEYS)
            if unknown:
                raise ContractError(f"sources has unknown keys {unknown}; it takes {sorted(SOURCE_KEYS)}")
            if not isinstance(data["feedback"], dict) or not isinstance(data["never"], list):
                raise ContractError(f"feedback must be an object and never a list, got {brief(data['feedback'])} "
                                    f"and {brief(data['never'])}")
            return cls(data["encoder"], data["step"], data["feedback"], specials, Sources(**sources),
                       tuple(data["never"]), data["max_decoding_length"])
        except (SpecialsError, TypeError) as err:
            raise ContractError(str(err)) from None

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> "TokenContract":
        """seq2onnx's own token models as contracts: the graphs `runtime.contract` declares for the spec, the fixed
        specials (<pad> and <s> never emitted), sources closed by </s> (reversed where trained so), and a
        transformer's position table bounding sources and outputs."""
        io = graph_io(spec)
        step = io[DECODER_STEP_FILE]
        feedback = {out: into for out, into in FEEDBACK.items() if out in step["outputs"]}
        limit = min(MAX_SOURCE_TOKENS, spec.max_positions) if spec.is_transformer else MAX_SOURCE_TOKENS
        return cls(io[ENCODER_FILE], step, feedback, FIXED, Sources(reverse=spec.reverse_source, max_len=limit),
                   (FIXED.pad, FIXED.bos), spec.max_positions if spec.is_transformer else None)


def _check_graph(decl: Any, what: str) -> None:
    """{"inputs": {name: dims}, "outputs": {name: dims}}, dims being symbolic names or sizes >= 0."""
    if not isinstance(decl, dict) or set(decl) != {"inputs", "outputs"}:
        raise ContractError(f"{what} must be an object with 'inputs' and 'outputs', got {brief(decl)}")
    for kind in ("inputs", "outputs"):
        if not isinstance(decl[kind], dict) or not decl[kind]:
            raise ContractError(f"{what} {kind} must be a non-empty object of name: dims, got {brief(decl[kind])}")
        for name, dims in decl[kind].items():
            if not isinstance(dims, list) or not all(isinstance(d, str) or is_count(d, 0) for d in dims):
                raise ContractError(f"{what} {kind[:-1]} {name!r}: dims must be a list of names and sizes, got "
                                    f"{brief(dims)}")

