"""int8 weights of the fast graphs: 7-bit values with one scale per output column, and the float32 weights they
widen back to where a graph multiplies in float32 over them (export.tokens.kernels.Net.widen)."""
from __future__ import annotations

import numpy as np
import torch

INT8_MAX = 63  # 7-bit weights, as export.quantize's reduce_range: u8 x s8 sums cannot saturate without VNNI


def int8_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (in, out) float -> int8 weights in [-63, 63] and one scale per output column (symmetric)."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / INT8_MAX  # (out,)
    return np.clip(np.round(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8), scale.astype(np.float32)


def widened_linear(layer: torch.nn.Linear) -> torch.nn.Linear:
    """A copy of layer whose weight is its int8 columns widened back to float32 (q * scale, a float32 product, as
    onnxruntime folds the graph's Cast and Mul)."""
    q, scale = int8_columns(layer.weight.detach().cpu().numpy().T)
    widened = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    with torch.no_grad():
        widened.weight.copy_(torch.from_numpy((q.astype(np.float32) * scale).T))
        if layer.bias is not None:
            widened.bias.copy_(layer.bias.detach())
    return widened
