"""int8 weights of the fast graphs: 7-bit values with one scale per output column, and the float32 weights they
widen back to where a graph multiplies in float32 over them (export.tokens.kernels.Net.widen)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from runtime.spec import ModelSpec

INT8_MAX = 63  # 7-bit weights, as export.quantize's reduce_range: u8 x s8 sums cannot saturate without VNNI
# Values in a model's largest weight matrix up to which its int8 graphs for few rows multiply in float32 over the int8
# weights (`widens`). onnxruntime 1.32, 1 thread, one row (five): DynamicQuantizeMatMul against a float32 MatMul over
# the same weights, 1.06x (0.96x) at 128 x 1024, 0.67x (0.63x) at 128 x 4096, 0.51x (0.53x) at 256 x 4096, 0.53x
# (0.60x) at 128 x 32000, 0.19x (0.24x) at 512 x 32000: float32 weights past the caches cost more than quantizing
# the row; at the dates transformer's 64 x 192 the float32 product is the faster (README, "Smaller exports").
WIDEN_UP_TO = 1 << 18


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


def widens(spec: ModelSpec) -> bool:
    """Whether an int8 export's graphs for few rows (the one-call graphs but the wide ones, and the fused step graph)
    multiply in float32 over the int8 weights (export.tokens.kernels.Net.widen) rather than in int8: where no
    weight matrix they quantize (the cross-attention's keys and values together, d_model x 2 d_model; the FFN's; the
    output layer's) holds more than WIDEN_UP_TO values. The self-attention's Q/K/V stays float32 in the Attention
    kernel either way."""
    e = spec.d_model
    return max(2 * e * e, e * spec.d_ff, e * spec.target_vocab_size) <= WIDEN_UP_TO
