"""PyTorch side of seq2onnx: the book's models, squares data, trainer and checkpoints."""
from __future__ import annotations

import importlib
from typing import Any

# Resolved on first use, so that `seq2onnx --help` (cli.train imports training.data) imports without torch.
_EXPORTS = {
    "Attention": ".models", "Decoder": ".models", "DecoderAttn": ".models", "Encoder": ".models",
    "EncoderDecoder": ".models", "EncoderDecoderAttn": ".models", "MultiHeadAttention": ".models",
    "build_model": ".build", "spec_from_model": ".build", "encode": ".decode", "reference_decode": ".decode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'training' has no attribute {name!r}")
