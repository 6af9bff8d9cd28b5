"""The weights an export starts from: float32 (the graphs are traced and checked in float32, and made float16 only
after, with dtype='fp16'; onnxruntime's recurrent kernels take no float64) and finite. One check for seq2onnx's own
model objects and checkpoints, one for a declared model's modules."""
from __future__ import annotations

import itertools

import torch

from .adapter import AdapterError, Seq2SeqAdapter
from .errors import ExportError


def check_weights(model: torch.nn.Module, described: str) -> None:
    """Every floating parameter and buffer float32 (the graphs are traced in float32; dtype='fp16' converts them
    after) and finite (a NaN weight made the parity check blame the export)."""
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        if not tensor.is_floating_point():
            continue
        if tensor.dtype != torch.float32:
            raise ExportError(f"{described}: {name} is {str(tensor.dtype).removeprefix('torch.')}, expected "
                              "float32 (export traces float32 graphs; dtype='fp16' converts them after); call "
                              ".float() on the model first")
        bad = int(tensor.numel() - torch.isfinite(tensor).sum())
        if bad:
            raise ExportError(f"{described}: {name} holds {bad} NaN or infinite value{'s' * (bad != 1)} of "
                              f"{tensor.numel()}; such a model cannot be exported or checked; retrain it or "
                              "repair its weights")


def check_declared_weights(adapter: Seq2SeqAdapter) -> None:
    """The declared modules' floating weights and buffers are float32: the graphs are exported and checked in
    float32 (onnxruntime's recurrent kernels take no float64), and made float16 only after (dtype='fp16')."""
    for i, root in enumerate(adapter.modules):
        for name, tensor in itertools.chain(root.named_parameters(), root.named_buffers()):
            if tensor.is_floating_point() and tensor.dtype != torch.float32:
                half = tensor.dtype in (torch.float16, torch.bfloat16)
                raise AdapterError(
                    f"modules[{i}] ({type(root).__name__}) holds {tensor.dtype} weights ({name!r}); the export works "
                    "in float32: call .float() on the model first"
                    + ("; for float16 graphs, export the float32 model with --dtype fp16 (dtype='fp16')" if half
                       else ""))
