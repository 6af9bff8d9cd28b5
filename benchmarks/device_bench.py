"""Token models on a GPU against the CPU: IO binding on and off, the step loop, fast graphs, fp16 exports.

    python benchmarks/device_bench.py MODEL_DIR [MODEL_DIR ...] [--device cuda] [--batch 1 64] [--beam 1 5]
        [--tokens 20] [--source-tokens 12] [--rounds 21] [--warmup 10] [--json FILE.json] [--force]

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
from bench_outputs import JSON, check_args, publish

from runtime.decode_options import check_decoding_length
from runtime.errors import InputError, ProviderError, Seq2OnnxError
from runtime.manifest import read_manifest
from runtime.model import Seq2Seq
from runtime.search.beam import MAX_BEAM
from runtime.tokens import encode_sources
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
    return models, reference


def check_models(model_dirs: list[Path]) -> None:
    """Every MODEL_DIR a directory holding a token model's export (its manifest read, nothing loaded)."""
    for model_dir in model_dirs:
        if not model_dir.is_dir():
            raise Refused(f"MODEL_DIR {model_dir}: expected a directory written by `seq2onnx export`, got "
                          f"{'a file' if model_dir.exists() else 'nothing there'}")
        kind = read_manifest(model_dir).spec.kind
        if kind != "tokens":
            raise Refused(f"MODEL_DIR {model_dir}: a {kind} model; this benchmark times token models")


def check_cases(models: dict[str, Seq2Seq], cases: dict[str, tuple[list[str], dict[str, Any]]], tokens: int,
                source_tokens: int) -> None:
    """Every case's texts and lengths within every model's limits, before any timing, named by their flags."""
    for model in models.values():
        try:
            check_decoding_length(model.spec, tokens, model.contract)
        except InputError as error:
            raise Refused(f"--tokens {tokens}: {error} ({model.path})") from None
        for source, _ in cases.values():
            try:
                encode_sources(source, model.vocabularies["source"], model.spec, model.contract)
            except InputError as error:
                raise Refused(f"--source-tokens {source_tokens}: {error} ({model.path})") from None


class Refused(Exception):
    """An input this benchmark cannot use: its one-line message, exit 1."""


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
        best[name] = [hyps[0].ids for hyps in model.translate_batch(batch, **options)]  # also the first warm-up
        for _ in range(warmup - 1):
            model.translate_batch(batch, **options)
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
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed decodes per side and case (default 10; one runs even at 0: its ids are what "
                             "\"agree\" compares)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--force", action="store_true", help="replace an existing --json file")
    args = parser.parse_args(argv)
    for name in ("tokens", "source_tokens", "rounds", "warmup"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')}: expected {'0 or more' if name == 'warmup' else '1 or more'}"
                         f", got {getattr(args, name)}")
    if min(args.batch) < 1 or not 1 <= min(args.beam) <= max(args.beam) <= MAX_BEAM:
        parser.error(f"--batch and --beam: expected batches >= 1 and beams from 1 to {MAX_BEAM}, got {args.batch} "
                     f"and {args.beam}")
    check_args(parser, args.json, "--json", args.force, JSON)
    try:
        check_models(args.model_dirs)
        report = run(args)
    except ProviderError as error:
        print(f"error: {error}{'; or pass --device cpu' if args.device == 'cuda' else ''}", file=sys.stderr)
        return 1
    except (Refused, Seq2OnnxError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:  # whole or not at all, as the runtime writes its files
        figures = {"device": args.device, "tokens": args.tokens, "rounds": args.rounds, "cases": report}
        publish(args.json, args.force, lambda f: f.write(json.dumps(figures, indent=2).encode()))
    return 0


def run(args: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    """Load every side, check every case against every model, then time case by case (printed as they finish)."""
    models, reference = load(args.model_dirs, args.device)
    vocabulary = next(iter(models.values())).vocabularies["source"]
    cases = {}
    for batch in args.batch:
        for beam in args.beam:
            options = dict(beam_size=beam, max_decoding_length=args.tokens, min_decoding_length=args.tokens)
            cases[f"{'greedy' if beam == 1 else f'beam {beam}'} b{batch}"] = (
                texts(vocabulary, batch, args.source_tokens, seed=batch * 1000 + beam), options)
    check_cases(models, cases, args.tokens, args.source_tokens)
    report = {}
    for case, (source, options) in cases.items():
        report[case] = time_case(models, reference, source, options, args.rounds, args.warmup)
        for name, row in report[case].items():
            print(f"{case:>12} | {name:<40} {row['median_ms']:9.3f} ms  x{row['ratio']:<6} "
                  f"agree {row['agree']:.2f}", flush=True)
    return report


if __name__ == "__main__":
    sys.exit(main())
