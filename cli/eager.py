"""PyTorch eager beside onnxruntime, for `seq2onnx bench --checkpoint` and benchmarks/recurrent_floor.py: the
checkpoint loaded, checked against the export, and its errors made one line. torch is imported here, not before."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .common import require_torch

EAGER_NEEDS_TORCH = "--checkpoint (PyTorch eager beside onnxruntime)"  # what require_torch names


def load_eager(checkpoint: Path, model_dir: Path, runtime: Any) -> Any:
    """PyTorch eager beside onnxruntime: `export.eager.Eager` for `checkpoint`, checked against MODEL_DIR's model (a
    user's error, one line); torch is imported here, not before."""
    require_torch(what=EAGER_NEEDS_TORCH)
    from export.eager import Eager
    from export.verify import input_errors

    try:
        return Eager(checkpoint, model_dir, runtime)
    except input_errors() as exc:
        raise click.ClickException(str(exc)) from None
