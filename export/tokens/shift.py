"""An attention's output bias moved into its values (`value_shift`): each query's weights sum to 1, so a constant
added to every value comes out of the attention whole, and the output projection then gives the bias from it with
no bias Add a step. `export.tokens.kernels.Net.shift` asks for it where a graph's caches are its own."""
from __future__ import annotations

import math

import numpy as np
import torch

SHIFT_TOLERANCE = 1e-6  # of the bias's largest magnitude (at least 1): how closely float32 c W^T must give b back,
# or within 4x the rounding float32 makes of that product (eps sqrt(E) |c| |W|), whichever is larger
SHIFT_MAX = 16.0  # the largest |c| allowed, times the bias's largest magnitude (at least 1): float32 values that
# carry c round to ~6e-8 |c|, so a projection far from orthogonal (large c) keeps its bias Add instead


def value_shift(fc: torch.nn.Linear) -> torch.Tensor | None:
    """c (E,) with c W^T = b for an attention's output projection fc (x W^T + b, W square), or None where W is
    singular, |c| is over SHIFT_MAX or float32 c W^T misses b by more than SHIFT_TOLERANCE allows. Added to every
    value the attention reads, c comes out of the attention whole (each query's weights sum to 1), and fc then
    gives the bias from it: one bias Add fewer a layer a step."""
    if fc.bias is None or fc.weight.shape[0] != fc.weight.shape[1]:
        return None
    w, b = fc.weight.detach().double().cpu(), fc.bias.detach().double().cpu()
    try:
        c = torch.linalg.solve(w, b)
    except RuntimeError:  # singular
        return None
    scale = max(1.0, float(b.abs().max()))
    if not bool(torch.isfinite(c).all()) or float(c.abs().max()) > SHIFT_MAX * scale:
        return None
    back = c.float() @ fc.weight.detach().float().cpu().T
    rounding = float(np.finfo(np.float32).eps) * math.sqrt(w.shape[0]) * float(c.abs().max() * w.abs().max())
    return c.float() if float((back.double() - b).abs().max()) <= max(SHIFT_TOLERANCE * scale, 4 * rounding) \
        else None
