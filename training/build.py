"""Build a model from a `ModelSpec`, and read the spec back off a model built elsewhere."""
from __future__ import annotations

from runtime.spec import ModelSpec, SpecError

from .models import (
    Attention,
    Decoder,
    DecoderAttn,
    Encoder,
    EncoderDecoder,
    EncoderDecoderAttn,
    MultiHeadAttention,
)


def build_model(spec: ModelSpec, teacher_forcing_prob: float = 0.5) -> EncoderDecoder:
    """Construct encoder, decoder and wrapper in the book's order (seeded runs match it)."""
    encoder = Encoder(spec.n_features, spec.hidden_dim)
    if spec.attention == "none":
        return EncoderDecoder(encoder, Decoder(spec.n_features, spec.hidden_dim),
                              spec.input_len, spec.target_len, teacher_forcing_prob)
    n_heads = spec.n_heads if spec.attention == "multihead" else None
    decoder = DecoderAttn(spec.n_features, spec.hidden_dim, n_heads=n_heads)
    return EncoderDecoderAttn(encoder, decoder, spec.input_len, spec.target_len, teacher_forcing_prob)


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
