"""Soak: thousands of mixed decodes on one loaded Seq2Seq, sampling the process RSS, to show memory stays flat.

    python benchmarks/soak_bench.py MODEL_DIR [--decodes N] [--sample-every 50] [--bound-mb 2] [--plot R.png] [--force]

The mix, drawn from a seeded generator: batch sizes 1 to 64; source lengths from 1 to 64 points (point models, half
the batches right-padded under a mask) or 1 to the model's input_len tokens (token models, every text its own
length); target lengths from 1 to 64 points, or max_decoding_length 1 to the model's target_len; token models
decode greedily (the greedy loop graph where the export has one), with beam search (beam 2 to 5) or by sampling
(temperature, top-k, top-p drawn too); a quarter of the decodes return attention.

Warm-up first runs the largest shape of the mix (so onnxruntime's arena has reached its peak), then --warmup random
decodes; from there RSS (VmRSS of /proc/self/status) is read every --sample-every decodes. Reported: RSS after
warm-up, at the end, the max; the growth, as the peak RSS of the second half of the run less the peak of the first
half (single readings swing by up to 15 MB as the allocator returns large blocks to the system and takes them back,
so end - start, or even medians, measure that noise; a leak raises the peak, the noise does not); the slope in MB
per 1000 decodes (least squares over all samples). Verdict "flat" when both the
growth and the slope over the whole run stay below --bound-mb; the exit code is 1 otherwise. Torch-free: runs on a
runtime-only install.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed copy
from bench_outputs import PNG, check_click, publish  # noqa: E402
from stops import StoppableCommand  # noqa: E402

from runtime.bench import fixed_length_text  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.sessions import max_threads  # noqa: E402
from runtime.tokens import source_token_limit  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64)
MAX_POINTS = 64  # longest point source and target of the mix
DEFAULT_DECODES = {"points": 40_000, "tokens": 10_000}  # about 2-3 minutes each on the 2-core development machine
LARGEST_REPEATS = 5
STATUS = Path("/proc/self/status")


def rss_mb() -> float:
    """Resident set size now (VmRSS), in MB; where /proc is missing, the peak (ru_maxrss) instead."""
    if STATUS.is_file():
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux (a peak, not the current)


def point_decode(model: Seq2Seq, rng: np.random.Generator, largest: bool = False) -> Callable[[], Any]:
    """One random (or the largest) point decode of the mix."""
    batch = BATCHES[-1] if largest else int(rng.choice(BATCHES))
    source_len = MAX_POINTS if largest else int(rng.integers(1, MAX_POINTS + 1))
    target_len = MAX_POINTS if largest else int(rng.integers(1, MAX_POINTS + 1))
    source = rng.normal(size=(batch, source_len, model.spec.n_features)).astype(np.float32)  # (N, Ls, F)
    mask = None
    if not largest and rng.random() < 0.5:  # right-padded: each row keeps 1..Ls valid points
        valid = rng.integers(1, source_len + 1, size=batch)  # (N,)
        mask = (np.arange(source_len)[None, :] < valid[:, None])[:, None, :]  # (N, 1, Ls)
    attention = bool(rng.random() < 0.25)
    return lambda: model.predict(source, target_len, mask, return_attention=attention)


def token_decode(model: Seq2Seq, rng: np.random.Generator, largest: bool = False) -> Callable[[], Any]:
    """One random (or the largest) token decode of the mix: greedy, beam search or sampling."""
    spec, vocab = model.spec, model.vocabularies["source"]
    longest = min(spec.input_len, source_token_limit(spec) - 1)
    batch = BATCHES[-1] if largest else int(rng.choice(BATCHES))
    lengths = [longest] * batch if largest else rng.integers(1, longest + 1, size=batch).tolist()
    texts = [fixed_length_text(vocab, int(n), rng) for n in lengths]
    options: dict[str, Any] = {"max_decoding_length": spec.target_len if largest else
                               int(rng.integers(1, spec.target_len + 1))}
    strategy = "beam" if largest else str(rng.choice(["greedy", "beam", "sample"]))
    if strategy == "beam":
        options["beam_size"] = 5 if largest else int(rng.integers(2, 6))
    elif strategy == "sample":
        options.update(sampling_topk=int(rng.choice([0, 5])), sampling_topp=float(rng.choice([1.0, 0.9])),
                       sampling_temperature=float(rng.choice([0.7, 1.0, 1.3])), seed=int(rng.integers(1 << 31)))
    options["return_attention"] = bool(rng.random() < 0.25)
    return lambda: model.translate_batch(texts, **options)


def slope_per_1000(samples: list[tuple[int, float]]) -> float:
    """Least-squares RSS growth in MB per 1000 decodes over (decodes, MB) samples."""
    if len(samples) < 2:
        return 0.0
    x, y = np.array(samples, dtype=np.float64).T  # (S,), (S,)
    return float(np.polyfit(x, y, 1)[0] * 1000)


def soak(model: Seq2Seq, decodes: int, warmup: int, every: int, seed: int) -> dict[str, Any]:
    """Warm up, then decode `decodes` times, sampling RSS every `every` decodes; the figures as a dict."""
    rng = np.random.default_rng(seed)
    make = point_decode if model.spec.kind == "points" else token_decode
    start = time.perf_counter()
    for _ in range(LARGEST_REPEATS):
        make(model, rng, largest=True)()
    for _ in range(warmup):
        make(model, rng)()
    warm_s = time.perf_counter() - start
    samples = [(0, rss_mb())]
    start = time.perf_counter()
    for done in range(1, decodes + 1):
        make(model, rng)()
        if done % every == 0 or done == decodes:
            samples.append((done, rss_mb()))
    seconds = time.perf_counter() - start
    rss = [mb for _, mb in samples]
    half = max(1, len(rss) // 2)
    return {"decodes": decodes, "warmup": warmup, "seconds": seconds, "warmup_seconds": warm_s,
            "ms_per_decode": seconds / decodes * 1e3, "rss_after_warmup_mb": rss[0], "rss_end_mb": rss[-1],
            "rss_max_mb": max(rss), "growth_mb": max(rss[half:] or rss) - max(rss[:half]),
            "slope_mb_per_1000": slope_per_1000(samples), "samples": samples}


def plot(figures: dict[str, Any], title: str, path: str, force: bool) -> None:
    """RSS against decodes after warm-up, with the least-squares line."""
    from matplotlib.figure import Figure

    x, y = np.array(figures["samples"], dtype=np.float64).T  # (S,), (S,)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.plot(x, y, ".-", label="RSS (VmRSS)")
    fit = np.polyval(np.polyfit(x, y, 1), x) if len(x) > 1 else y  # (S,): the line the slope comes from
    ax.plot(x, fit, "--", label=f"least squares: {figures['slope_mb_per_1000']:+.3f} MB / 1000 decodes")
    ax.set_xlabel("decodes after warm-up")
    ax.set_ylabel("MB")
    ax.set_title(title, fontsize="medium")
    ax.legend()
    publish(path, force, lambda f: fig.savefig(f, format="png", dpi=100))


def summary(f: dict[str, Any], largest: int) -> str:
    """The figures in three lines: the run, RSS, the verdict."""
    run = (f"soak: {f['model_dir']} ({f['kind']} model{', greedy loop graph' * f['fused']}), {f['decodes']} mixed "
           f"decodes after {largest} of the largest shape and {f['warmup']} random ones, {f['threads']} thread(s): "
           f"{f['seconds']:.0f} s, {f['ms_per_decode']:.2f} ms per decode")
    rss = (f"RSS after warm-up {f['rss_after_warmup_mb']:.1f} MB, at the end {f['rss_end_mb']:.1f} MB, max "
           f"{f['rss_max_mb']:.1f} MB; growth {f['growth_mb']:+.2f} MB (peak of the second half less that of the "
           f"first), slope {f['slope_mb_per_1000']:+.4f} MB per 1000 decodes ({len(f['samples'])} samples)")
    verdict = (f"verdict: {f['verdict']} (bound: the growth, and the slope over {f['decodes']} decodes, each under "
               f"{f['bound_mb']:g} MB)")
    return f"{run}\n{rss}\n{verdict}"


@click.command(cls=StoppableCommand)
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--decodes", type=click.IntRange(1), default=None,
              help=f"Decodes after warm-up (default {DEFAULT_DECODES['points']} for point models, "
                   f"{DEFAULT_DECODES['tokens']} for token models: about 2-3 minutes each on 2 cores).")
@click.option("--warmup", type=click.IntRange(0), default=500, show_default=True,
              help="Random decodes after the largest shapes, before RSS is first read.")
@click.option("--sample-every", "every", type=click.IntRange(1), default=50, show_default=True,
              help="Read RSS every K decodes.")
@click.option("--bound-mb", type=click.FloatRange(0, min_open=True), default=2.0, show_default=True,
              help="'flat' when growth and slope x decodes / 1000 both stay below this.")
@click.option("--threads", type=click.IntRange(1, max_threads()), default=1, show_default=True)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="RSS plot to FILE.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object instead of the summary.")
@click.option("--force", is_flag=True, help="Replace an existing --plot file.")
def main(model_dir: Path, decodes: int | None, warmup: int, every: int, bound_mb: float, threads: int, seed: int,
         plot_path: str | None, as_json: bool, force: bool) -> None:
    """Decode a mix of shapes and strategies thousands of times on one model; report whether RSS stays flat."""
    check_click(plot_path, "--plot", force, PNG)  # said now, not after minutes of decoding
    model = Seq2Seq.load(model_dir, provider="cpu", threads=threads)
    decodes = decodes or DEFAULT_DECODES[model.spec.kind]
    figures = soak(model, decodes, warmup, every, seed)
    projected = figures["slope_mb_per_1000"] * decodes / 1000  # falling is no leak: only growth counts
    flat = figures["growth_mb"] < bound_mb and projected < bound_mb
    figures.update(model_dir=str(model_dir), kind=model.spec.kind, fused=model.has_fused, threads=threads,
                   bound_mb=bound_mb, verdict="flat" if flat else "growing")
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
    else:
        click.echo(summary(figures, LARGEST_REPEATS))
    if plot_path:
        plot(figures, f"{model_dir}: RSS over {decodes} mixed decodes ({figures['verdict']})", plot_path, force)
        click.echo(f"wrote {plot_path}", err=True)
    if not flat:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
