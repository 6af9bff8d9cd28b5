"""The token model a spec asks for: recurrent (GRU/LSTM) or transformer."""
from __future__ import annotations

from runtime.spec import ModelSpec

from .recurrent import TokenSeq2Seq
from .token_base import TokenModel
from .transformer import TransformerSeq2Seq

TOKEN_MODEL_CLASSES = (TokenSeq2Seq, TransformerSeq2Seq)


def build_token_model(spec: ModelSpec) -> TokenModel:
    """A freshly initialised token model for `spec` (kind 'tokens')."""
    if spec.kind != "tokens":
        raise ValueError(f"build_token_model needs a spec of kind 'tokens', got {spec.kind!r}")
    return TransformerSeq2Seq(spec) if spec.is_transformer else TokenSeq2Seq(spec)
