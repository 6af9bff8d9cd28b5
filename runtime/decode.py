"""The autoregressive loop: encode once, then step, feed the prediction back, stop."""
from __future__ import annotations

from typing import Callable

import numpy as np

# A graph runner takes a feed {input name: array} and returns {output name: array}.
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def greedy_decode(
    run_encoder: Runner, run_step: Runner, step_inputs: list[str],
    source: np.ndarray, source_mask: np.ndarray, target_len: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode `target_len` points -> outputs (N, Lt, F) and alphas (N, [heads,] Lt, Ls) or None."""
    states = run_encoder({"source": source, "source_mask": source_mask})
    states["source_mask"] = source_mask
    feed = {name: states[name] for name in step_inputs}
    outputs, alphas = [], []
    for _ in range(target_len):
        result = run_step(feed)
        outputs.append(result["output"])  # (N, 1, F)
        if "alphas" in result:
            alphas.append(result["alphas"])  # (N, [heads,] 1, Ls)
        feed["decoder_input"], feed["hidden"] = result["output"], result["hidden_out"]
    attention = np.concatenate(alphas, axis=-2) if alphas else None
    return np.concatenate(outputs, axis=1), attention
