"""One export through the public API three ways, side by side: one thread, N intra-op threads, and N workers of one
thread each (`Seq2Seq.load(workers=N)`, runtime.workers: a call's inputs split into chunks decoded at once).

    python benchmarks/workers_bench.py MODEL_DIR [--batch 64 ...] [--beam 1 ...] [--workers 2] [--repeats 20]

Token models decode texts of their own source vocabulary (SOURCE_TOKENS tokens each, seeded) to exactly --steps
tokens (min = max length); point models decode seeded random sources of 50 points to 100. The three decoders'
outputs are checked equal first, then timed in interleaved rounds (the order reversed every other round); prints
each one's median and its ratio to one thread's (< 1: faster) per case.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stops import StoppableCommand  # noqa: E402

from runtime.errors import Seq2OnnxError  # noqa: E402
from runtime.infer_tokens import MAX_BATCH  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.sessions import max_threads  # noqa: E402
from runtime.spec import N_SPECIAL_TOKENS  # noqa: E402

SOURCE_TOKENS = 12
POINTS = (50, 100)  # source points, decoded points


def inputs(model: Seq2Seq, batch: int) -> Any:
    """`batch` seeded sources: texts of SOURCE_TOKENS tokens of the model's vocabulary, or (batch, 50, F) points."""
    rng = np.random.default_rng(0)
    if model.spec.kind == "points":
        return rng.standard_normal((batch, POINTS[0], model.spec.n_features)).astype(np.float32)
    vocab = model.vocabularies["source"]
    words = vocab.tokens[N_SPECIAL_TOKENS:]
    joiner = "" if vocab.tokenizer == "char" else " "
    return [joiner.join(rng.choice(words, SOURCE_TOKENS)) for _ in range(batch)]


def call(model: Seq2Seq, source: Any, beam: int, steps: int) -> Callable[[], Any]:
    """One decode of `source`; returns what to compare."""
    if model.spec.kind == "points":
        return lambda: model.predict(source, target_len=POINTS[1])
    options = dict(beam_size=beam, min_decoding_length=steps, max_decoding_length=steps)
    return lambda: [[(h.ids, h.score) for h in hyps] for hyps in model.translate_batch(source, **options)]


@click.command(cls=StoppableCommand, help="Time one thread, N intra-op threads and N workers of one thread on MODEL_DIR, interleaved.")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--batch", "batches", type=click.IntRange(1, MAX_BATCH), multiple=True, help="Inputs a call (default 64).")
@click.option("--beam", "beams", type=click.IntRange(1, 16), multiple=True, help="Token models (default 1 and 5).")
@click.option("--workers", type=click.IntRange(2), default=2, show_default=True,
              help="N: the workers, and the intra-op threads of the second decoder.")
@click.option("--steps", type=click.IntRange(1), default=None,
              help="Token models: tokens decoded per input (default 20).")
@click.option("--repeats", type=click.IntRange(1), default=20, show_default=True, help="Timed rounds per case.")
def main(model_dir: Path, batches: tuple[int, ...], beams: tuple[int, ...], workers: int, steps: int | None,
         repeats: int) -> None:
    if workers > max_threads():
        raise click.BadParameter(f"expected at most the {max_threads()} CPUs this process may use, got {workers}",
                                 param_hint="'--workers'")
    try:
        models = {"1 thread": Seq2Seq.load(model_dir, provider="cpu", threads=1),
                  f"{workers} threads": Seq2Seq.load(model_dir, provider="cpu", threads=workers),
                  f"{workers} workers": Seq2Seq.load(model_dir, provider="cpu", workers=workers)}
    except Seq2OnnxError as err:
        raise click.ClickException(str(err)) from None
    first = models["1 thread"]
    for given, flag, why in ((beams, "--beam", "decodes greedily"), (steps, "--steps", f"decodes {POINTS[1]} points")):
        if first.spec.kind == "points" and given:
            raise click.BadParameter(f"{model_dir} is a point model, which {why}; drop {flag}", param_hint=f"'{flag}'")
    steps = steps or 20
    beams = beams if first.spec.kind == "tokens" else (1,)
    click.echo(f"{model_dir}: {first.spec.kind} model, {max_threads()} CPUs; medians of {repeats} interleaved rounds")
    for batch in batches or (64,):
        source = inputs(first, batch)
        for beam in beams or (1, 5):
            calls = {name: call(model, source, beam, steps) for name, model in models.items()}
            try:
                outputs = {name: c() for name, c in calls.items()}
            except Seq2OnnxError as err:  # --steps beyond what the model decodes, say: its one line
                raise click.UsageError(str(err)) from None
            same = all(_equal(out, outputs["1 thread"]) for out in outputs.values())
            times: dict[str, list[float]] = {name: [] for name in calls}
            for r in range(repeats):
                for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append(time.perf_counter() - start)
            base = statistics.median(times["1 thread"])
            cells = ", ".join(f"{name} {statistics.median(t) * 1e3:.2f} ms ({statistics.median(t) / base:.2f}x)"
                              for name, t in times.items())
            click.echo(f"batch {batch} beam {beam}: {cells}; outputs {'equal' if same else 'DIFFER'}")


def _equal(a: Any, b: Any) -> bool:
    return bool(np.array_equal(a, b)) if isinstance(a, np.ndarray) else a == b


if __name__ == "__main__":
    main()
