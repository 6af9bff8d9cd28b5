"""Runtime benchmark: onnxruntime decode vs PyTorch eager, and precomputed vs per-step key projection.

    python benchmarks/runtime_bench.py [--hidden-dim 64] [--repeats 30]

Prints medians (ms) measured side by side in one run, and their ratios. Needs the `train` extra.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort
import torch
import torch.nn as nn

from export.api import export_model
from export.graphs import dynamic_axes
from runtime import Seq2Seq
from runtime.spec import ModelSpec
from training.build import build_model
from training.points.decode import reference_decode
from training.points.models import EncoderDecoder


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class ProjectEveryStep(nn.Module):
    """A step graph that re-projects the keys at every step (what the encoder graph saves us)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.decoder = model.decoder

    def forward(self, x, hidden, hidden_seq, mask):
        proj_keys, values = self.decoder.attn.project_keys(hidden_seq)
        return self.decoder.step(x, hidden, proj_keys.transpose(-1, -2), values, mask)


def step_sessions(model: EncoderDecoder, spec: ModelSpec, out: Path, n: int, length: int):
    """The exported step (precomputed keys) and the per-step-projection variant, with feeds."""
    runtime = Seq2Seq.load(out, provider="cpu")
    rng = np.random.default_rng(0)
    source = rng.normal(size=(n, length, spec.n_features)).astype(np.float32)
    mask = np.ones((n, 1, length), dtype=bool)
    states = runtime.run_encoder({"source": source, "source_mask": mask})
    fast_feed = {k: states[k] for k in ("decoder_input", "hidden", "keys_t", "values")} | {"source_mask": mask}
    with torch.no_grad():
        hidden_seq = model.encoder(torch.from_numpy(source)).numpy()
    slow_path = out.parent / "project_every_step.onnx"
    names = ["decoder_input", "hidden", "hidden_seq", "source_mask"]
    axes = {"decoder_input": {0: "batch"}, "hidden": {1: "batch"}, "hidden_seq": {0: "batch", 1: "source_len"},
            "source_mask": {0: "batch", 2: "source_len"}}
    slow_feed = {"decoder_input": fast_feed["decoder_input"], "hidden": fast_feed["hidden"],
                 "hidden_seq": hidden_seq, "source_mask": mask}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ProjectEveryStep(model), tuple(torch.from_numpy(slow_feed[k]) for k in names), str(slow_path),
                          input_names=names, output_names=["output", "hidden_out", "alphas"],
                          dynamic_axes=axes | dynamic_axes({"output": ["batch", 1, 2]}), opset_version=17, dynamo=False)
    slow = ort.InferenceSession(str(slow_path), providers=["CPUExecutionProvider"])
    return runtime._step, fast_feed, slow, slow_feed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, CPU, 1 thread each; medians of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for attention, heads in (("dot", 1), ("multihead", args.heads)):
            torch.manual_seed(0)
            spec = ModelSpec(hidden_dim=args.hidden_dim, attention=attention, n_heads=heads)
            model = build_model(spec).eval()
            out = export_model(model, Path(tmp) / attention)
            runtime = Seq2Seq.load(out, provider="cpu", threads=1)
            print(f"\n== {attention} attention, hidden {args.hidden_dim}, heads {heads}")
            print(f"{'batch':>5} {'src':>4} {'tgt':>4} {'onnxruntime ms':>15} {'torch ms':>9} {'torch/ort':>9}")
            for n, ls, lt in ((1, 2, 2), (1, 50, 20), (64, 50, 20), (256, 100, 20)):
                source = np.random.default_rng(1).normal(size=(n, ls, 2)).astype(np.float32)
                t_ort = median_ms(partial(runtime.predict, source, lt), args.repeats)
                src_t = torch.from_numpy(source)
                t_pt = median_ms(partial(reference_decode, model, src_t, lt), args.repeats)
                print(f"{n:>5} {ls:>4} {lt:>4} {t_ort:>15.3f} {t_pt:>9.3f} {t_pt / t_ort:>8.2f}x")
            print(f"{'batch':>5} {'src':>4} {'step, keys precomputed ms':>26} {'step, keys projected ms':>24} {'ratio':>6}")
            for n, ls in ((1, 50), (64, 50), (256, 100)):
                fast, fast_feed, slow, slow_feed = step_sessions(model, spec, out, n, ls)
                t_fast = median_ms(partial(fast.run, None, fast_feed), args.repeats * 3)
                t_slow = median_ms(partial(slow.run, None, slow_feed), args.repeats * 3)
                print(f"{n:>5} {ls:>4} {t_fast:>26.3f} {t_slow:>24.3f} {t_slow / t_fast:>5.2f}x")


if __name__ == "__main__":
    main()
