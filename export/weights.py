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
        bad = _non_finite(tensor)
        if bad:
            raise ExportError(f"{described}: {name} {bad}")


def _non_finite(tensor: torch.Tensor, infinite: bool = False) -> str:
    """'' for a finite tensor (with `infinite`, one without NaN), else what is wrong with it, read after its name (a
    NaN weight made the parity check blame the export; an infinite one that a saturating gate hid was published)."""
    bad = int(torch.isnan(tensor).sum() if infinite else tensor.numel() - torch.isfinite(tensor).sum())
    if not bad:
        return ""
    what = "NaN" if infinite else "NaN or infinite"
    return (f"holds {bad} {what} value{'s' * (bad != 1)} of {tensor.numel()}; such a model cannot be exported or "
            "checked; retrain it or repair its weights")


def check_declared_weights(adapter: Seq2SeqAdapter) -> None:
    """The declared modules' floating weights and buffers are float32 (the graphs are exported and checked in
    float32: onnxruntime's recurrent kernels take no float64; made float16 only after, dtype='fp16'); the weights
    finite, the buffers without NaN (a buffer may be a mask of -inf, as a causal mask often is)."""
    for i, root in enumerate(adapter.modules):
        weights = {id(p) for p in root.parameters()}
        for name, tensor in itertools.chain(root.named_parameters(), root.named_buffers()):
            if not tensor.is_floating_point():
                continue
            if tensor.dtype != torch.float32:
                half = tensor.dtype in (torch.float16, torch.bfloat16)
                raise AdapterError(
                    f"modules[{i}] ({type(root).__name__}) holds {tensor.dtype} weights ({name!r}); the export works "
                    "in float32: call .float() on the model first"
                    + ("; for float16 graphs, export the float32 model with --dtype fp16 (dtype='fp16')" if half
                       else ""))
            bad = _non_finite(tensor, infinite=id(tensor) not in weights)
            if bad:
                raise AdapterError(f"modules[{i}] ({type(root).__name__}): {name} {bad}")
