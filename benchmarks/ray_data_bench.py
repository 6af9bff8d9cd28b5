"""Offline decoding throughput: `infer --ray` (Ray Data, 1 and 2 actors) against in-process `infer`, same inputs.

    python benchmarks/ray_data_bench.py [--n 10000] [--repeats 3] [--batch-size 32] [--model artifacts/dates]

Inputs are --n dates in every human format of training.tokens.data (3 to 30 characters), greedy decoding with the
shipped dates model. Every row produces the JSON lines `infer` writes, from the same texts:
  in-process tN    runtime.infer_tokens.TokenRun.records (what `infer` runs), onnxruntime with N intra-op threads
  in-proc t1 sort  the same with the texts sorted by length first: the padding that sorting saves, without Ray
  ray K actor(s)   serving.offline.decode_texts on a local Ray started once (ray.init is not timed): K actors of
                   1 CPU / 1 thread each, each loading the model, inputs sorted by length within blocks
  ray fixed cost   the same for one input and one actor: starting the actor pool and loading the model, which
                   every `infer --ray` pays once (the "ray" rows include it)
Each repeat runs every row once, in turn, so drift hits all alike; figures are medians. `vs t1` is a row's seq/s over
in-process t1's (> 1: faster). On a 2-core machine, 2 actors and 2 threads compete with the driver and with
anything else running; read the ratios on a machine with idle cores.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import click
import ray

from runtime.infer_tokens import Item, TokenRun
from runtime.model import Seq2Seq
from serving.offline import Plan, decode_texts
from training.tokens.builtin import generate_dates

ROOT = Path(__file__).resolve().parents[1]
GREEDY = dict(beam_size=1, num_hypotheses=1, length_penalty=1.0, max_decoding_length=None, min_decoding_length=0,
              sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=None)
SEED = 20


def in_process(model_dir: Path, texts: list[str], threads: int, batch_size: int) -> Callable[[], int]:
    """A run of in-process infer's decode loop (model loaded once, outside the timing); returns the lines made."""
    model = Seq2Seq.load(model_dir, threads=threads)

    def run() -> int:
        records = TokenRun(model, GREEDY, batch_size, False, False).records(
            (Item(i, text, "") for i, text in enumerate(texts)))
        return sum(1 for doc in records if json.dumps(doc))
    return run


def on_ray(model_dir: Path, texts: list[str], actors: int, batch_size: int) -> Callable[[], int]:
    """A run of `infer --ray`'s decoding on the local Ray, actor pool start included; returns the lines made."""
    plan = Plan(str(model_dir), batch_size=batch_size, options=GREEDY)
    return lambda: len(decode_texts(texts, plan, actors=actors))


def timed(run: Callable[[], int], expected: int) -> float:
    """Seconds one run takes; it must make one line per input."""
    start = time.perf_counter()
    made = run()
    seconds = time.perf_counter() - start
    assert made == expected, (made, expected)
    return seconds


@click.command()
@click.option("--n", type=click.IntRange(1), default=10_000, show_default=True, help="Date inputs to decode.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=ROOT / "artifacts" / "dates", show_default=True)
def main(n: int, repeats: int, batch_size: int, model_dir: Path) -> None:
    """Print a table of medians: seconds, sequences per second, and the ratio to in-process with one thread."""
    texts = generate_dates(n, SEED).sources
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a benchmark run is no usage to report
    start = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    print(f"ray.init (not timed below): {time.perf_counter() - start:.1f} s; {n} inputs, --batch-size {batch_size}")
    rows = {"in-process t1": (in_process(model_dir, texts, 1, batch_size), n),
            "in-process t2": (in_process(model_dir, texts, 2, batch_size), n),
            "in-proc t1 sort": (in_process(model_dir, sorted(texts, key=len), 1, batch_size), n),
            "ray 1 actor": (on_ray(model_dir, texts, 1, batch_size), n),
            "ray 2 actors": (on_ray(model_dir, texts, 2, batch_size), n),
            "ray fixed cost": (on_ray(model_dir, texts[:1], 1, batch_size), 1)}
    try:
        times: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(repeats):
            for name, (run, expected) in rows.items():
                times[name].append(timed(run, expected))
    finally:
        ray.shutdown()
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = n / medians["in-process t1"]
    print(f"{'row':<16} {'median s':>9} {'seq/s':>8} {'vs t1':>6}   (runs: s)")
    for name, seconds in medians.items():
        count = rows[name][1]
        ratio = f"{count / seconds / base:6.2f}" if count == n else f"{'-':>6}"  # one input: no throughput to compare
        print(f"{name:<16} {seconds:9.2f} {count / seconds:8.0f} {ratio}   "
              f"({', '.join(f'{t:.2f}' for t in times[name])})")


if __name__ == "__main__":
    main()
