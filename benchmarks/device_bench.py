"""Token models on a GPU against the CPU: IO binding on and off, the step loop, fast graphs, fp16 exports.

    python benchmarks/device_bench.py MODEL_DIR [MODEL_DIR ...] [--device cuda] [--batch 1 64] [--beam 1 5]
        [--tokens 20] [--source-tokens 12] [--rounds 21] [--warmup 10] [--json FILE]

Every model directory is loaded as several sides: on --device with IO binding, without it, with the step loop in
place of the one-call graphs, with the plain graphs in place of a transformer's fast ones, and on the CPU with one
thread and with the runtime's default (at most 4). For each (batch, beam) case all sides of all models decode the
same random texts (--source-tokens of the first model's source tokens), exactly --tokens tokens each, taking turns
call by call and reversing their order every round; each side reports its median, its ratio to the first side, and
how often its best hypothesis equals that of its own model's first side. --device cpu runs the same sides on the
CPU, which checks the script where there is no GPU. The H200 figures in the README's "IO binding and devices" came
from this.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import Seq2OnnxError
from runtime.model import Seq2Seq
from runtime.vocab import Vocabulary


def sides(model_dir: Path, device: str, label: str) -> dict[str, dict[str, Any]]:
    """Seq2Seq.load options per side of one model directory, named '<label> <side>'."""
    out = {"bound": dict(provider=device, io_binding=True), "unbound": dict(provider=device, io_binding=False),
           "step loop": dict(provider=device, io_binding=True, fused=False)}
    if any(model_dir.glob("fast_*.onnx")):
        out["plain graphs"] = dict(provider=device, io_binding=True, fast=False)
    out.update({"cpu 1 thread": dict(provider="cpu", threads=1), "cpu default threads": dict(provider="cpu")})
    return {f"{label} {name}" if name.startswith("cpu ") else f"{label} {device} {name}": options
            for name, options in out.items()}


def load(model_dirs: list[Path], device: str) -> tuple[dict[str, Seq2Seq], dict[str, str]]:
    """Every side of every model, loaded before any timing, and each side's reference: its model's first side."""
    models, reference = {}, {}
    for index, model_dir in enumerate(model_dirs):
        named = [d.name for d in model_dirs].count(model_dir.name) > 1
        first = None
        for name, options in sides(model_dir, device, f"{model_dir.name}#{index}" if named else model_dir.name).items():
            models[name] = Seq2Seq.load(model_dir, **options)
            first = reference[name] = first or name
            if models[name].spec.kind != "tokens":
                raise SystemExit(f"{model_dir}: a {models[name].spec.kind} model; this benchmark times token models")
    return models, reference


def texts(vocabulary: Vocabulary, count: int, length: int, seed: int) -> list[str]:
    """Random texts of `length` source tokens (the same for every side of a case): characters for a character
    vocabulary, else words joined by spaces; special tokens (<...>) left out."""
    tokens = [t for t in vocabulary.tokens if not (t.startswith("<") and t.endswith(">")) and t.strip() == t and t]
    chars = vocabulary.tokenizer == "char"
    rng = np.random.default_rng(seed)
    return [("" if chars else " ").join(rng.choice(tokens, length)) for _ in range(count)]


def time_case(models: dict[str, Seq2Seq], reference: dict[str, str], batch: list[str], options: dict[str, Any],
              rounds: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Median ms per side, its ratio to the first side, and how often its best ids equal its model's first side's."""
    first = next(iter(models))
    best = {}
    for name, model in models.items():
        for _ in range(warmup):
            got = model.translate_batch(batch, **options)
        best[name] = [hyps[0].ids for hyps in got]
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(rounds):
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
            start = time.perf_counter()
            models[name].translate_batch(batch, **options)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {name: {"median_ms": round(medians[name], 3), "ratio": round(medians[name] / medians[first], 3),
                   "agree": float(np.mean([a == b for a, b in zip(best[name], best[reference[name]])]))}
            for name in models}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", nargs="+", type=Path, metavar="MODEL_DIR")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--beam", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--tokens", type=int, default=20, help="tokens decoded, exactly (default 20)")
    parser.add_argument("--source-tokens", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    for name in ("tokens", "source_tokens", "rounds", "warmup"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if min(args.batch + args.beam) < 1:
        parser.error(f"--batch and --beam: expected numbers >= 1, got {args.batch} and {args.beam}")
    try:
        models, reference = load(args.model_dirs, args.device)
        vocabulary = next(iter(models.values())).vocabularies["source"]
        report = {}
        for batch in args.batch:
            for beam in args.beam:
                case = f"{'greedy' if beam == 1 else f'beam {beam}'} b{batch}"
                options = dict(beam_size=beam, max_decoding_length=args.tokens, min_decoding_length=args.tokens)
                source = texts(vocabulary, batch, args.source_tokens, seed=batch * 1000 + beam)
                report[case] = time_case(models, reference, source, options, args.rounds, args.warmup)
                for name, row in report[case].items():
                    print(f"{case:>12} | {name:<40} {row['median_ms']:9.3f} ms  x{row['ratio']:<6} "
                          f"agree {row['agree']:.2f}", flush=True)
    except Seq2OnnxError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "tokens": args.tokens, "rounds": args.rounds,
                                         "cases": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
