"""PyTorch side of seq2onnx: the book's models, squares data, trainer and checkpoints."""
from .build import build_model, spec_from_model
from .decode import encode, reference_decode
from .models import (
    Attention,
    Decoder,
    DecoderAttn,
    Encoder,
    EncoderDecoder,
    EncoderDecoderAttn,
    MultiHeadAttention,
)

__all__ = [
    "Attention", "Decoder", "DecoderAttn", "Encoder", "EncoderDecoder", "EncoderDecoderAttn",
    "MultiHeadAttention", "build_model", "spec_from_model", "encode", "reference_decode",
]
