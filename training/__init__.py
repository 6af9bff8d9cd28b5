"""PyTorch side of seq2onnx: model families as siblings (`points/`: the book's models on points; `tokens/`: recurrent
and transformer token models), each with its data and trainer; `build` (spec -> model), checkpoints, torchrun."""
from __future__ import annotations

import importlib
from typing import Any

# Resolved on first use, so that `seq2onnx --help` (cli.train imports training.points.data) imports without torch.
_EXPORTS = {
    "Attention": ".points.models", "Decoder": ".points.models", "DecoderAttn": ".points.models",
    "Encoder": ".points.models", "EncoderDecoder": ".points.models", "EncoderDecoderAttn": ".points.models",
    "MultiHeadAttention": ".points.models", "encode": ".points.decode", "reference_decode": ".points.decode",
    "TrainConfig": ".points.trainer", "Trainer": ".points.trainer",
    "TokenSeq2Seq": ".tokens.recurrent", "TransformerSeq2Seq": ".tokens.transformer",
    "TokenTrainConfig": ".tokens.trainer", "TokenTrainer": ".tokens.trainer",
    "build_model": ".build", "build_point_model": ".build", "build_token_model": ".build",
    "spec_from_model": ".build",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'training' has no attribute {name!r}")
