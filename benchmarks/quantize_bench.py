"""File size and decode speed of fp32, int8 and fp16 exports of one seeded point model (no training).

    python benchmarks/quantize_bench.py [--hidden 256] [--length 10] [--repeats 50] [--threads 1]

Builds a seeded random GRU + dot-attention point model, exports it three times (`export_model` with quantize='int8'
and dtype='fp16'; a loss beyond tolerance is accepted and shown, since the figures are the point), then times
`Seq2Seq.predict` (the runtime's default: the greedy loop graph) at batch 1 and 256 on CPU, the modes taking
turns call by call, and prints medians and ratios against fp32.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from export.api import export_model
from export.quality_rows import failures
from runtime.contract import MANIFEST_FILE
from runtime.model import Seq2Seq
from runtime.spec import ModelSpec
from training.build import build_model

MODES = {"fp32": {}, "int8": {"quantize": "int8"}, "fp16": {"dtype": "fp16"}}
BATCHES = (1, 256)


def export_all(root: Path, hidden: int, length: int) -> dict[str, tuple[Path, str]]:
    """Each mode's export directory and its quality verdict."""
    torch.manual_seed(0)
    spec = ModelSpec(n_features=2, hidden_dim=hidden, attention="dot", input_len=length, target_len=length)
    model = build_model(spec).eval()
    out = {}
    for mode, options in MODES.items():
        verdict: list[str] = ["-"]

        def judge(rows: list, verdict: list[str] = verdict) -> None:
            verdict[0] = f"{len(failures(rows))} of {sum(r.limit is not None for r in rows)} beyond tolerance"

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = export_model(model, root / mode, accept_quality_loss=bool(options), on_quality=judge, **options)
        out[mode] = (path, verdict[0])
    return out


def median_ms(runtimes: dict[str, Seq2Seq], source: np.ndarray, length: int, repeats: int) -> dict[str, float]:
    """Median wall time of one predict call per mode, after a warm-up call; the modes take turns call by call, so
    load from other processes on a shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {mode: [] for mode in runtimes}
    for runtime in runtimes.values():
        runtime.predict(source, length)
    for _ in range(repeats):
        for mode, runtime in runtimes.items():
            start = time.perf_counter()
            runtime.predict(source, length)
            times[mode].append(time.perf_counter() - start)
    return {mode: 1000 * statistics.median(t) for mode, t in times.items()}


def main() -> None:
    """Export, time, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--length", type=int, default=10, help="source and target length")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1,
                        help="onnxruntime intra-op threads (1: steady figures on a shared 2-core machine)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        exports = export_all(Path(tmp), args.hidden, args.length)
        sizes = {m: sum(f.stat().st_size for f in p.iterdir() if f.name != MANIFEST_FILE)
                 for m, (p, _) in exports.items()}
        runtimes = {mode: Seq2Seq.load(path, provider="cpu", threads=args.threads)
                    for mode, (path, _) in exports.items()}
        by_batch = {n: median_ms(runtimes, rng.normal(size=(n, args.length, 2)).astype(np.float32), args.length,
                                 args.repeats) for n in BATCHES}
        timings = {mode: {n: by_batch[n][mode] for n in BATCHES} for mode in runtimes}
    print(f"hidden {args.hidden}, dot attention, source/target length {args.length}, {args.repeats} repeats, "
          f"{args.threads} thread(s), median ms per predict call (onnxruntime CPU)")
    head = f"{'mode':<6} {'graph bytes':>12} {'size':>6} " + " ".join(
        f"{'b' + str(n) + ' ms':>10} {'speed':>6}" for n in BATCHES) + "  quality"
    print(head)
    print("-" * len(head))
    for mode, (_, verdict) in exports.items():
        cells = " ".join(f"{timings[mode][n]:>10.2f} {timings['fp32'][n] / timings[mode][n]:>5.2f}x" for n in BATCHES)
        print(f"{mode:<6} {sizes[mode]:>12,} {sizes[mode] / sizes['fp32']:>5.2f}x {cells}  {verdict}")


if __name__ == "__main__":
    main()
