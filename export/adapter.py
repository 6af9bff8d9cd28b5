"""Bring your own PyTorch seq2seq: a model declared as an encode function, a one-step function and its state.

    adapter = Seq2SeqAdapter(
        encode=lambda source_ids, source_lengths: {"hidden": h, "memory": m},   # (N, L) int64, (N,) int64
        step=lambda tokens, state: (log_probs, {"hidden": h2}, attention),       # (N,) int64 -> (N, V), ..., (N, L)
        state={"hidden": State(batch_axis=1), "memory": State(batch_axis=0, changes=False)},
        source_vocab=Vocabulary(tokens, "whitespace", specials=Specials(bos=0, eos=1)), target_vocab=...,
        modules=[encoder, decoder])
    export_model(adapter, "models/mine")        # or: seq2onnx export --adapter mymodule:make_adapter --out models/mine

`encode` returns every state tensor by name; `step` takes the previous token of each row (bos at the first step)
and the state, and returns the next-token scores (log-probs, or logits with scores="logits"), the next value of
every state tensor the step changes (a dict; entries it does not change may be left out) and optionally the
attention over the source (N, L) (None otherwise). Each state tensor declares its batch axis, whether the step
changes it (hidden and cell states, a token prefix or cache) or carries it unchanged (encoder memory, keys, masks:
beam search then expands it once instead of reordering it every step), and for a prefix or cache the axis a step
lengthens by one. Special ids are the vocabularies' own (`runtime.specials.Specials`). The export traces both
functions with the legacy exporter, so they must compute shapes from tensors (x.shape[0]), not from Python ints.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from runtime.defaults import MAX_TARGET_LEN
from runtime.errors import brief, is_count
from runtime.vocab import Vocabulary

from .errors import ExportError

SCORES = ("log_probs", "logits")
MAX_NAME_CHARS = 200  # of Seq2SeqAdapter.name
Reference = Callable[[torch.Tensor, torch.Tensor, int], Sequence[Sequence[int]]]


class AdapterError(ExportError, ValueError):
    """A declared model whose declaration and behaviour disagree, or that cannot be exported as declared."""


@dataclass(frozen=True)
class State:
    """One state tensor: its batch axis; whether a step changes it; the axis a step lengthens by one, if any."""

    batch_axis: int
    changes: bool = True
    grows: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_axis", "grows"):
            value = getattr(self, name)
            if value is None and name == "grows":
                continue
            if not is_count(value):
                raise AdapterError(f"State.{name} must be an axis (an int >= 0), got {brief(value)}")
        if not isinstance(self.changes, bool):
            raise AdapterError(f"State.changes must be True or False, got {brief(self.changes)}")
        if self.grows is not None and (self.grows == self.batch_axis or not self.changes):
            raise AdapterError(f"State(grows={self.grows}) needs a step that changes the tensor, on an axis other "
                               f"than the batch axis {self.batch_axis}")


@dataclass(frozen=True)
class Seq2SeqAdapter:
    """A user's own encoder and decoder step, declared for export (see the module docstring).

    fixed_source_len: the model reads sources of exactly this many tokens (trained on sources padded to it); the
    runtime pads to it and refuses longer texts. max_source_len: the most tokens a source may hold otherwise.
    max_decoding_length: the default longest output; output_limit: the most tokens the model can produce at all (a
    fixed-size output buffer), which the runtime then refuses to exceed. reference: the model's own greedy decode,
    (source_ids (N, L), source_lengths (N,), max_length) -> each row's ids up to (without) eos, checked token for
    token at export.
    modules: the modules holding the weights: put in eval mode, and named when tracing fails inside one."""

    encode: Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]]
    step: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], tuple]
    state: Mapping[str, State]
    source_vocab: Vocabulary
    target_vocab: Vocabulary
    modules: Sequence[torch.nn.Module] = ()
    scores: str = "log_probs"
    never_emit: Sequence[int] = ()
    source_bos: bool = False
    source_eos: bool = True
    reverse_source: bool = False
    fixed_source_len: int | None = None
    max_source_len: int = 256
    max_decoding_length: int = 50
    output_limit: int | None = None
    reference: Reference | None = None
    name: str = "adapter"  # how the manifest's 'source' names it

    def __post_init__(self) -> None:
        for name in ("encode", "step"):
            if not callable(getattr(self, name)):
                raise AdapterError(f"Seq2SeqAdapter.{name} must be a function, got {brief(getattr(self, name))}")
        if self.reference is not None and not callable(self.reference):
            raise AdapterError(f"Seq2SeqAdapter.reference must be a function or None, got {brief(self.reference)}")
        if not isinstance(self.state, Mapping) or not self.state:
            raise AdapterError(f"Seq2SeqAdapter.state must map each state tensor's name to a State, got "
                               f"{brief(self.state)}")
        for name, decl in self.state.items():
            if not isinstance(name, str) or not name.isidentifier():
                bad = [n for n in self.state if not isinstance(n, str) or not n.isidentifier()]
                raise AdapterError(f"Seq2SeqAdapter.state's names must be Python identifiers (they name the graphs' "
                                   f"inputs and outputs), got {brief(bad)}: rename them (h0, not 'h.0')")
            if not isinstance(decl, State):
                raise AdapterError(f"Seq2SeqAdapter.state[{name!r}] must be a State, got {brief(decl)}")
        if not any(decl.changes for decl in self.state.values()):
            raise AdapterError("Seq2SeqAdapter.state: no entry changes (State(changes=True)); a step must carry "
                               "something from one token to the next")
        for side in ("source_vocab", "target_vocab"):
            if not isinstance(getattr(self, side), Vocabulary):
                raise AdapterError(f"Seq2SeqAdapter.{side} must be a runtime.vocab.Vocabulary, got "
                                   f"{brief(getattr(self, side))}")
        if self.scores not in SCORES:
            raise AdapterError(f"Seq2SeqAdapter.scores must be one of {SCORES}, got {brief(self.scores)}")
        self._check_ints()
        if isinstance(self.modules, torch.nn.Module) or not isinstance(self.modules, Iterable):
            raise AdapterError(f"Seq2SeqAdapter.modules must be a list of torch.nn.Modules, got {brief(self.modules)}"
                               "; pass modules=[...], even for one")
        modules = tuple(self.modules)
        if not all(isinstance(m, torch.nn.Module) for m in modules):
            raise AdapterError(f"Seq2SeqAdapter.modules must be torch.nn.Modules, got {brief(modules)}")
        if (not isinstance(self.name, str) or not self.name.strip() or not self.name.isprintable()
                or len(self.name) > MAX_NAME_CHARS):
            raise AdapterError(f"Seq2SeqAdapter.name must be a printable str of 1 to {MAX_NAME_CHARS} characters "
                               f"(the manifest's source names it), got {brief(self.name)}")
        object.__setattr__(self, "modules", modules)
        object.__setattr__(self, "never_emit", tuple(self.never_emit))

    def _check_ints(self) -> None:
        for name in ("source_bos", "source_eos", "reverse_source"):
            if not isinstance(getattr(self, name), bool):
                raise AdapterError(f"Seq2SeqAdapter.{name} must be True or False, got {brief(getattr(self, name))}")
        for name in ("max_source_len", "max_decoding_length"):
            if not is_count(getattr(self, name), 1):
                raise AdapterError(f"Seq2SeqAdapter.{name} must be an int >= 1, got {brief(getattr(self, name))}")
        if self.max_decoding_length > MAX_TARGET_LEN:  # the runtime refuses to decode more in one call
            raise AdapterError(f"Seq2SeqAdapter.max_decoding_length must be at most {MAX_TARGET_LEN} (the most tokens "
                               f"one decode produces), got {self.max_decoding_length}")
        if self.output_limit is not None and not is_count(self.output_limit, self.max_decoding_length):
            raise AdapterError(f"Seq2SeqAdapter.output_limit must be None or an int >= max_decoding_length "
                               f"({self.max_decoding_length}), got {brief(self.output_limit)}")
        if self.fixed_source_len is not None and not is_count(self.fixed_source_len, 2):
            raise AdapterError(f"Seq2SeqAdapter.fixed_source_len must be an int >= 2 or None, got "
                               f"{brief(self.fixed_source_len)}")
        size = len(self.target_vocab)
        bad = [i for i in self.never_emit if not is_count(i, 0) or i >= size or i == self.target_vocab.ids.eos]
        if bad:
            raise AdapterError(f"Seq2SeqAdapter.never_emit must hold target ids (0..{size - 1}) other than eos "
                               f"{self.target_vocab.ids.eos}, got {brief(bad)}")

    @property
    def changing(self) -> list[str]:
        """The state a step changes, in declaration order."""
        return [name for name, decl in self.state.items() if decl.changes]

    def train_mode_off(self) -> None:
        """Every declared module in eval mode (dropout off), as the graphs are traced and checked."""
        for module in self.modules:
            module.eval()
