"""Torch-free runtime: load an exported seq2onnx model and decode with onnxruntime."""
from __future__ import annotations

from typing import Any

from .spec import ModelSpec, SpecError

__version__ = "0.1.0"
__all__ = ["ModelSpec", "SpecError", "Seq2Seq", "__version__"]


def __getattr__(name: str) -> Any:
    # Loaded on first use so that `runtime.spec` is importable without onnxruntime.
    if name == "Seq2Seq":
        from .model import Seq2Seq

        return Seq2Seq
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
