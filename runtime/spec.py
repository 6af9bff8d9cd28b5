"""The one contract: every size and choice a seq2onnx model is built from (stdlib only)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ATTENTION_KINDS = ("none", "dot", "additive", "multihead")
CELLS = ("gru", "lstm")
KINDS = ("points", "tokens")
# Token models: GRU/LSTM encoder-decoder, the transformer, or a user's own model exported through a declared contract
# (runtime.declared: its sizes and names live there; the spec keeps its vocabulary sizes and lengths).
TRAINABLE_ARCHS = ("recurrent", "transformer")  # what `seq2onnx train` builds
ARCHS = (*TRAINABLE_ARCHS, "declared")
NORMS = ("pre", "post")  # transformer: LayerNorm before each sub-layer (and after the stack), or after each residual
POSITIONALS = ("sinusoidal", "learned")
DEFAULT_MAX_POSITIONS = 1024  # transformer position table: covers the runtime's longest source (1024 tokens)
# What the points pipeline (the book's models) supports; token models take the whole range.
POINTS_ATTENTION = ("none", "dot", "multihead")
TOKEN_ATTENTION = ("none", "dot", "additive", "multihead")
N_SPECIAL_TOKENS = 4  # pad, bos, eos, unk: a token vocabulary holds at least these
# Fields added after the first format: absent in older spec.json / manifest.json files, which load with these values.
ADDED_FIELDS = ("kind", "layers", "bidirectional", "embedding_dim", "source_vocab_size", "target_vocab_size",
                "tie_embeddings", "reverse_source", "arch", "d_model", "d_ff", "norm", "positional",
                "max_positions", "dropout")
# What a declared model's spec holds (its contract holds the rest): runtime.declared.
DECLARED_FIELDS = ("kind", "arch", "source_vocab_size", "target_vocab_size", "input_len", "target_len")
# Transformer fields and their values on every other model.
TRANSFORMER_FIELDS = {"d_model": 0, "d_ff": 0, "norm": "pre", "positional": "sinusoidal", "max_positions": 0,
                      "dropout": 0.0}


class SpecError(ValueError):
    """A model spec (from a checkpoint, a manifest or the CLI) is malformed."""


@dataclass(frozen=True)
class ModelSpec:
    """Sizes and choices of an encoder-decoder model; saved in checkpoints and manifests."""

    n_features: int = 2
    hidden_dim: int = 2
    attention: str = "dot"
    n_heads: int = 1
    cell: str = "gru"
    input_len: int = 2
    target_len: int = 2
    kind: str = "points"
    layers: int = 1
    bidirectional: bool = False
    embedding_dim: int = 0  # token models only
    source_vocab_size: int = 0  # token models only
    target_vocab_size: int = 0  # token models only
    tie_embeddings: bool = False  # token models: the output projection reuses the target embedding
    reverse_source: bool = False  # token models: source tokens are fed in reverse order (EOS stays last)
    arch: str = "recurrent"  # token models: "recurrent" (GRU/LSTM) or "transformer"
    d_model: int = 0  # transformer: model width; hidden_dim and embedding_dim are set to it
    d_ff: int = 0  # transformer: inner width of each feed-forward block
    norm: str = "pre"  # transformer: "pre" (LayerNorm before each sub-layer, one after each stack) or "post"
    positional: str = "sinusoidal"  # transformer: "sinusoidal" (fixed) or "learned" position embeddings
    max_positions: int = 0  # transformer: rows of the position table (0: DEFAULT_MAX_POSITIONS)
    dropout: float = 0.0  # transformer: dropout in training (embeddings, attention weights, sub-layer outputs)

    def __post_init__(self) -> None:
        if self.arch == "transformer":
            self._fill_transformer()
        for name in ("n_features", "hidden_dim", "n_heads", "input_len", "target_len", "layers"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("embedding_dim", "source_vocab_size", "target_vocab_size"):
            _require_int(name, getattr(self, name), minimum=0)
        for name in ("bidirectional", "tie_embeddings", "reverse_source"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"spec field {name!r} must be true or false, got {getattr(self, name)!r}")
        for name, allowed in (("kind", KINDS), ("attention", ATTENTION_KINDS), ("cell", CELLS), ("arch", ARCHS),
                              ("norm", NORMS), ("positional", POSITIONALS)):
            if getattr(self, name) not in allowed:
                raise SpecError(f"spec field {name!r} must be one of {allowed}, got {getattr(self, name)!r}")
        (self._check_transformer if self.arch == "transformer" else self._check_not_transformer)()
        if self.attention != "multihead" and self.n_heads != 1:
            raise SpecError(f"spec field 'n_heads' must be 1 unless attention is 'multihead', got {self.n_heads}")
        if self.arch == "declared":
            if self.attention == "dot":  # left at the dataclass's default: a declared model's attention is its own
                object.__setattr__(self, "attention", "none")
            self._check_declared()
            return
        (self._check_tokens if self.kind == "tokens" else self._check_points)()

    def _fill_transformer(self) -> None:
        """A transformer's hidden_dim and embedding_dim are d_model, its attention is multi-head and its position
        table has DEFAULT_MAX_POSITIONS rows unless given: fields left at their defaults are filled in."""
        fill = {"hidden_dim": (2, self.d_model), "embedding_dim": (0, self.d_model), "attention": ("dot", "multihead"),
                "max_positions": (0, DEFAULT_MAX_POSITIONS)}
        _require_int("d_model", self.d_model, minimum=1)
        for name, (default, value) in fill.items():
            if getattr(self, name) == default:
                object.__setattr__(self, name, value)

    def _check_transformer(self) -> None:
        """Transformer sizes: heads split d_model; recurrent-only fields stay at their defaults."""
        if self.kind != "tokens":
            raise SpecError(f"spec field 'arch' is 'transformer', which needs kind 'tokens', got {self.kind!r}")
        for name in ("d_model", "d_ff", "max_positions"):
            _require_int(name, getattr(self, name), minimum=1)
        same = {"hidden_dim": self.d_model, "embedding_dim": self.d_model, "attention": "multihead", "cell": "gru",
                "bidirectional": False}
        wrong = {k: getattr(self, k) for k, v in same.items() if getattr(self, k) != v}
        if wrong:
            raise SpecError(f"spec fields {wrong} do not fit a transformer of d_model {self.d_model}: its hidden_dim "
                            f"and embedding_dim are d_model, and it takes {same} (leave them out to get these)")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise SpecError(f"spec field 'dropout' must be a number in [0, 1), got {self.dropout!r}")

    def _check_not_transformer(self) -> None:
        """Transformer fields stay at their defaults on every other model."""
        wrong = {k: getattr(self, k) for k, v in TRANSFORMER_FIELDS.items() if getattr(self, k) != v}
        if wrong:
            raise SpecError(f"spec fields {wrong} are for transformers (arch 'transformer'); this model takes "
                            f"{TRANSFORMER_FIELDS}")

    def _check_points(self) -> None:
        """The book's point models: one GRU layer each way, no embeddings."""
        plain = dict(cell="gru", layers=1, bidirectional=False, embedding_dim=0, source_vocab_size=0,
                     target_vocab_size=0, tie_embeddings=False, reverse_source=False)
        wrong = {k: getattr(self, k) for k, v in plain.items() if getattr(self, k) != v}
        if wrong or self.attention not in POINTS_ATTENTION:
            wrong.update({} if self.attention in POINTS_ATTENTION else {"attention": self.attention})
            raise SpecError(f"spec fields {wrong} are for token models (kind 'tokens'); point models take "
                            f"{plain} and attention in {POINTS_ATTENTION}")

    def _check_declared(self) -> None:
        """A declared model: a token model whose graphs, state and special ids its contract declares; the spec holds
        its vocabulary sizes, input_len (the longest source it reads) and target_len (the default longest output),
        every other field at its default and attention 'none' (what it attends to is the contract's)."""
        if self.kind != "tokens":
            raise SpecError(f"spec field 'arch' is 'declared', which needs kind 'tokens', got {self.kind!r}")
        for name in ("source_vocab_size", "target_vocab_size"):
            _require_int(name, getattr(self, name), minimum=2)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        own = (*DECLARED_FIELDS, "attention")
        wrong = {k: getattr(self, k) for k in defaults if k not in own and getattr(self, k) != defaults[k]}
        if wrong or self.attention != "none":
            wrong.update({} if self.attention == "none" else {"attention": self.attention})
            raise SpecError(f"spec fields {wrong} do not apply to a declared model (arch 'declared'): its contract "
                            "holds its sizes; leave them out (attention: 'none')")

    @property
    def is_declared(self) -> bool:
        """True for a user's own model exported through a declared contract."""
        return self.arch == "declared"

    def _check_tokens(self) -> None:
        """Token models need embeddings and vocabularies holding at least the special tokens."""
        _require_int("embedding_dim", self.embedding_dim, minimum=1)
        if self.attention not in TOKEN_ATTENTION:
            raise SpecError(f"spec field 'attention' of a token model must be one of {TOKEN_ATTENTION}, got "
                            f"{self.attention!r}")
        if self.hidden_dim % self.n_heads:
            width = "d_model" if self.arch == "transformer" else "hidden_dim"
            raise SpecError(f"spec field {width!r} ({self.hidden_dim}) must be a multiple of 'n_heads' "
                            f"({self.n_heads}): each head attends in {width} / n_heads dimensions")
        for name in ("source_vocab_size", "target_vocab_size"):
            _require_int(name, getattr(self, name), minimum=N_SPECIAL_TOKENS + 1)

    @property
    def directions(self) -> int:
        """2 for a bidirectional encoder, else 1."""
        return 2 if self.bidirectional else 1

    @property
    def head_dim(self) -> int:
        """Dimensions per attention head of a multi-head token model (hidden_dim / n_heads)."""
        return self.hidden_dim // self.n_heads

    @property
    def is_transformer(self) -> bool:
        """True for the transformer token model."""
        return self.arch == "transformer"

    @property
    def has_attention(self) -> bool:
        """True when the decoder attends over the encoder states."""
        return self.attention != "none"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, the inverse of `from_dict`; added fields at their defaults are left out, so point
        models write exactly what older readers expect; a declared model writes only the fields that apply."""
        if self.is_declared:
            return {k: getattr(self, k) for k in DECLARED_FIELDS}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ADDED_FIELDS or v != defaults[k]}

    def described(self) -> dict[str, Any]:
        """The fields that describe this model (`GET /v1/model`, repr): every field, or a declared model's own ones
        (DECLARED_FIELDS; its contract holds its sizes, and the others would show meaningless defaults)."""
        return self.to_dict() if self.is_declared else dataclasses.asdict(self)

    def __repr__(self) -> str:  # written here, dataclass leaves it; the same as its own for every other model
        return f"ModelSpec({', '.join(f'{k}={v!r}' for k, v in self.described().items())})"

    @classmethod
    def from_dict(cls, data: Any) -> "ModelSpec":
        """Rebuild a spec, refusing unknown or missing fields by name."""
        if not isinstance(data, dict):
            raise SpecError(f"model spec must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"model spec has unknown fields {unknown}; known fields are {sorted(known)}")
        optional = set(ADDED_FIELDS) | (known - set(DECLARED_FIELDS) if data.get("arch") == "declared" else set())
        missing = sorted(known - set(data) - optional)
        if missing:
            raise SpecError(f"model spec is missing fields {missing}")
        return cls(**data)


def _require_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"spec field {name!r} must be an int >= {minimum}, got {value!r}")
