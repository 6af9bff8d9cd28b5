"""Build a model of any kind from a `ModelSpec`, and read the spec back off a point model built elsewhere.

`BUILDERS` is the one place a spec's kind picks a model family: the book's point models, or a token model
(recurrent GRU/LSTM, or the transformer)."""
from __future__ import annotations

from typing import Callable

from runtime.spec import ModelSpec, SpecError
from training.points.models import (
    Attention,
    Decoder,
    DecoderAttn,
    Encoder,
    EncoderDecoder,
    EncoderDecoderAttn,
    MultiHeadAttention,
)
from training.tokens.base import TokenModel
from training.tokens.recurrent import TokenSeq2Seq
from training.tokens.transformer import TransformerSeq2Seq

DEFAULT_TEACHER_FORCING = 0.5
TOKEN_MODEL_CLASSES = (TokenSeq2Seq, TransformerSeq2Seq)


def build_point_model(spec: ModelSpec, teacher_forcing_prob: float = DEFAULT_TEACHER_FORCING) -> EncoderDecoder:
    """Construct encoder, decoder and wrapper in the book's order (seeded runs match it)."""
    encoder = Encoder(spec.n_features, spec.hidden_dim)
    if spec.attention == "none":
        return EncoderDecoder(encoder, Decoder(spec.n_features, spec.hidden_dim),
                              spec.input_len, spec.target_len, teacher_forcing_prob)
    n_heads = spec.n_heads if spec.attention == "multihead" else None
    decoder = DecoderAttn(spec.n_features, spec.hidden_dim, n_heads=n_heads)
    return EncoderDecoderAttn(encoder, decoder, spec.input_len, spec.target_len, teacher_forcing_prob)


def build_token_model(spec: ModelSpec, teacher_forcing_prob: float | None = None) -> TokenModel:
    """A freshly initialised token model for `spec`: recurrent or transformer. (Token trainers apply teacher
    forcing themselves, so the argument is accepted for a uniform signature and unused.)"""
    if spec.kind != "tokens":
        raise ValueError(f"build_token_model needs a spec of kind 'tokens', got {spec.kind!r}")
    return TransformerSeq2Seq(spec) if spec.is_transformer else TokenSeq2Seq(spec)


BUILDERS: dict[str, Callable[..., EncoderDecoder | TokenModel]] = {
    "points": build_point_model, "tokens": build_token_model}


def build_model(spec: ModelSpec, teacher_forcing_prob: float = DEFAULT_TEACHER_FORCING) -> EncoderDecoder | TokenModel:
    """A freshly initialised model of `spec`'s kind (`teacher_forcing_prob`: the book's point models only)."""
    return BUILDERS[spec.kind](spec, teacher_forcing_prob)


def spec_from_model(model: EncoderDecoder) -> ModelSpec:
    """Infer the spec of a book-style model (e.g. one trained outside seq2onnx)."""
    if not isinstance(model, EncoderDecoder):
        raise SpecError(f"model must be an EncoderDecoder or EncoderDecoderAttn, got {type(model).__name__}")
    enc, dec = model.encoder, model.decoder
    common = dict(n_features=enc.n_features, hidden_dim=enc.hidden_dim,
                  input_len=int(model.input_len), target_len=int(model.target_len))
    if isinstance(dec, Decoder):
        return ModelSpec(attention="none", **common)
    if not isinstance(dec, DecoderAttn):
        raise SpecError(f"model.decoder must be a Decoder or DecoderAttn, got {type(dec).__name__}")
    if isinstance(dec.attn, MultiHeadAttention):
        return ModelSpec(attention="multihead", n_heads=len(dec.attn.attn_heads), **common)
    if isinstance(dec.attn, Attention):
        return ModelSpec(attention="dot", **common)
    raise SpecError(f"model.decoder.attn must be Attention or MultiHeadAttention, got {type(dec.attn).__name__}")
