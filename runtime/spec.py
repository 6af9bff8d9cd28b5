"""The one contract: every size and choice a seq2onnx model is built from (stdlib only)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ATTENTION_KINDS = ("none", "dot", "multihead")
CELLS = ("gru",)


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

    def __post_init__(self) -> None:
        for name in ("n_features", "hidden_dim", "n_heads", "input_len", "target_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"spec field {name!r} must be a positive int, got {value!r}")
        if self.attention not in ATTENTION_KINDS:
            raise SpecError(f"spec field 'attention' must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.cell not in CELLS:
            raise SpecError(f"spec field 'cell' must be one of {CELLS}, got {self.cell!r}")
        if self.attention != "multihead" and self.n_heads != 1:
            raise SpecError(f"spec field 'n_heads' must be 1 unless attention is 'multihead', got {self.n_heads}")

    @property
    def has_attention(self) -> bool:
        """True when the decoder attends over the encoder states."""
        return self.attention != "none"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, the inverse of `from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "ModelSpec":
        """Rebuild a spec, refusing unknown or missing fields by name."""
        if not isinstance(data, dict):
            raise SpecError(f"model spec must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"model spec has unknown fields {unknown}; known fields are {sorted(known)}")
        missing = sorted(known - set(data))
        if missing:
            raise SpecError(f"model spec is missing fields {missing}")
        return cls(**data)
