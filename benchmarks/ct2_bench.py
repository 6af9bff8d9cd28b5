"""seq2onnx against CTranslate2 on the same transformer: outputs cross-checked token for token, then decode times.

    python benchmarks/ct2_bench.py --checkpoint CKPT [--steps 20] [--repeats 24] [--batches 1,64] [--beams 1,5]
                                   [--threads 1,2] [--workers 1,2] [--instances 3] [--keep-within 1.5]
                                   [--allocator system]
                                   [--json OUT.json] [--plot OUT.png] [--force]

CKPT is a `seq2onnx train --arch transformer` checkpoint. It is exported twice through the public API
(`export_model`: float32, and `quantize="int8"` as `seq2onnx export --quantize int8`; whatever graphs the export
writes, `Seq2Seq.load` picks up) and converted once with benchmarks/ct2_convert.py; CTranslate2 quantizes that
float32 model itself when loaded with compute_type "int8". All of it lives in a temporary directory.

Cross-check first (float32; benchmarks/ct2_check.py, whose docstring lists where CTranslate2's semantics differ
from ours): greedy and beam ids identical on CHECK_TEXTS held-out `dates` sources, log-probs within its tolerance;
a disagreement stops the run before any timing.

Timing: sources are the held-out `dates` texts of exactly SOURCE_TOKENS characters (12 tokens, 13 encoder positions
with the </s>), repeated in order to fill a batch. Every case (batch, beam) decodes exactly --steps tokens per
hypothesis on both sides (min = max = --steps; checked on the warm-up outputs). Decoders of a case, each side x
precision x thread count: seq2onnx `Seq2Seq.load(dir, threads=t).translate_batch(texts, ...)` (text in, text out)
and CT2 `Translator(dir, device="cpu", compute_type=..., intra_threads=t, inter_threads=1).translate_batch(tokens,
...)` (tokens in, tokens out; with --ct2-text, text in and text out as ours: the call also splits the texts with
the model's vocabulary and joins the output tokens). --workers W > 1 adds a data-parallel decoder a side, W copies of
1 thread each: ours `Seq2Seq.load(dir, threads=1, workers=W)` (runtime.workers: it splits calls of 2 x SPLIT_ROWS
rows or more), CT2 `Translator(..., intra_threads=1, inter_threads=W).translate_batch(..., max_batch_size=ceil(batch
/ W))`, which hands the chunks to its W workers at once. Configurations read "1t" (threads) or "2w" (workers). Each
decoder is loaded --instances times (copies made in turn,
ours and CTranslate2's): two sessions of one graph ran up to ~10% apart, each keeping its speed for the whole run,
so with one copy a side a run's ratio carried that copy's luck; round r times copy r mod --instances (N). After WARMUP
untimed rounds of a call of every copy, a configuration whose fastest call took over --keep-within (KEEP_WITHIN) times
its side's fastest (the same precision) in every round after the first is left out, reported by its fastest warm-up
call: it cannot be that side's best, and run between the others it slowed them. Then --repeats rounds run every other
decoder in turn (in reverse order in rounds N..2N-1, 3N..4N-1, ...: every copy in both orders when --repeats is a
multiple of 2N), so drift hits all alike; in a round each decoder runs --inner calls in a row (default: as many as last
~20 ms, the same count for every decoder of a case) and their mean is one sample, so a batch-1 call is timed with its
model in cache, as a service under load runs it, not right after seven other decoders evicted it.
Figures are medians; each side is reported at its best configuration; ratio = seq2onnx / CT2 (> 1: seq2onnx is
slower). "paired" is the median over rounds of the two sides' ratio within a round (each at its best
configuration), samples taken tens of milliseconds apart: a shared machine's slow and fast phases, which last seconds, move
both samples of a round alike and cancel there, where they move a ratio of medians (four runs of batch-1 greedy on
one machine: ratio of medians 1.16-1.65, paired 1.52-1.59).
--allocator (cli.allocator, as `seq2onnx serve --allocator`) runs the whole process, both engines, with another C
allocator: the script starts itself again with it preloaded.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import ctranslate2
import numpy as np
import onnxruntime as ort
from bench_outputs import JSON, PNG, check_click, publish
from ct2_check import check_failures, cross_check, ct2_ids
from ct2_convert import ConversionError, checkpoint_spec, convert, source_tokens
from stops import StoppableCommand

from cli.allocator import choose as choose_allocator
from export.api import QualityLossWarning, export_model
from runtime.bench_report import cpu_model
from runtime.contract import VOCAB_FILES
from runtime.errors import MissingExtraError
from runtime.infer_tokens import MAX_BATCH as MAX_LIST_BATCH
from runtime.model import Seq2Seq
from runtime.plot import require_matplotlib
from runtime.search.beam import MAX_BEAM
from runtime.sessions import max_threads
from runtime.vocab import Vocabulary
from training.checkpoint import CheckpointError
from training.tokens.builtin import DATES
from training.tokens.data import load_text_dataset

SOURCE_TOKENS = 12  # tokens of a timed source (dates: characters); its encoder reads 13 positions with the </s>
CHECK_TEXTS = 256  # held-out sources of any length for the cross-check
WARMUP = 3
SAMPLE_S = 0.02  # --inner 0: calls in a row per sample, so that a sample lasts about this long
# --keep-within: a configuration whose fastest call is over this times its side's fastest in every warm-up round after
# the first is left out of the timed rounds. On 2-core VMs 2 threads were the slower everywhere (CTranslate2 7-55x its
# 1-thread time at batch 1, 1.4-2.1x at 64; ours 1.07-1.8x), and timed beside the others they disturbed both sides'
# samples and moved the paired ratio: a 2-core AMD EPYC Zen 4, greedy batch 1, nine runs each way alternated
# (RESULTS.md, runs 174-195), paired float32 ratio with them left out / timed: median 1.29 / 1.44, lower in eight pairs.
# 1.5, not 1.25, and judged round by round: a burst of load over a configuration's warm-up calls must not leave out its
# side's best (runs 189 and 200 did).
KEEP_WITHIN = 1.5
PRECISIONS = {"fp32": "float32", "int8": "int8"}  # ours -> CT2's compute_type
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
Key = tuple[str, str, str]  # (side, precision, configuration: "2t" intra-op threads, "2w" workers of 1 thread)
Ids = list[list[int]]


def held_out(vocab: Vocabulary) -> tuple[list[str], list[str]]:
    """(cross-check sources, timed sources of SOURCE_TOKENS tokens of `vocab`) from the `dates` test split."""
    _, test = load_text_dataset(DATES)
    timed = [s for s in test.sources if len(vocab.tokenize(s)) == SOURCE_TOKENS]
    if not timed:
        raise click.ClickException(f"no held-out {DATES} source is {SOURCE_TOKENS} tokens long in the checkpoint's "
                                   f"{vocab.tokenizer!r} source vocabulary; pass a checkpoint trained on {DATES}")
    return list(test.sources[:CHECK_TEXTS]), timed


def prepare(checkpoint: Path, root: Path, steps: int,
            note: Callable[[str], None]) -> tuple[dict[str, Path], tuple[list[str], list[str]]]:
    """The CT2 conversion 'ct2' (first: it refuses anything but a transformer at once, and --steps past the model's
    max_positions or a vocabulary without held-out sources to time is refused before the exports) and the exports
    'fp32' and 'int8' of `checkpoint`, under `root`; and the held-out sources (`held_out`)."""
    dirs = {"ct2": root / "ct2", "fp32": root / "fp32", "int8": root / "int8"}
    note(f"converting {checkpoint} for CTranslate2 ...")
    try:
        convert(checkpoint, dirs["ct2"])
        limit = checkpoint_spec(checkpoint).max_positions  # a transformer's: convert refuses anything else
    except (ConversionError, CheckpointError) as err:
        raise click.ClickException(str(err)) from None
    if steps > limit:
        raise click.BadParameter(f"{steps} is more than this transformer's max_positions {limit} (output token t "
                                 "reads row t)", param_hint="'--steps'")
    sources = held_out(Vocabulary.load(checkpoint / VOCAB_FILES["source"]))  # not trained on dates: said now
    note(f"exporting {checkpoint} (fp32, then int8) ...")
    export_model(checkpoint, dirs["fp32"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QualityLossWarning)
        export_model(checkpoint, dirs["int8"], quantize="int8", accept_quality_loss=True)
    for warning in caught:
        note(f"note: {warning.message}")  # a timing run takes the int8 graphs as they are
    return dirs, sources


def configurations(threads: list[int], workers: list[int]) -> list[str]:
    """Each side's ways to use the CPUs: "Nt", N intra-op threads in one copy; "Nw", N copies of one thread."""
    return [f"{t}t" for t in threads] + [f"{w}w" for w in workers if w > 1]


def load(dirs: dict[str, Path], configs: list[str], instances: int = 1) -> dict[Key, list[Any]]:
    """Every decoder, loaded `instances` times, the copies made in turn (ours, CTranslate2's, ours, ...):
    (side, precision, configuration) -> its Seq2Seq or ctranslate2.Translator copies."""
    loaded: dict[Key, list[Any]] = {}
    for _ in range(instances):
        for precision, compute_type in PRECISIONS.items():
            for config in configs:
                n, workers = int(config[:-1]), config.endswith("w")
                loaded.setdefault(("seq2onnx", precision, config), []).append(
                    Seq2Seq.load(dirs[precision], provider="cpu", threads=1 if workers else n,
                                 workers=n if workers else 1))
                loaded.setdefault(("ct2", precision, config), []).append(ctranslate2.Translator(
                    str(dirs["ct2"]), device="cpu", compute_type=compute_type, intra_threads=1 if workers else n,
                    inter_threads=n if workers else 1))
    return loaded


def decoders(loaded: dict[Key, list[Any]], model: Seq2Seq, texts: list[str], beam: int, steps: int,
             ct2_text: bool = False) -> dict[Key, list[Callable[[], Ids]]]:
    """Each decoder's copies as calls decoding `texts` to `steps` ids per text (checked in `measure`). CT2 gets
    token lists, its API; with `ct2_text` its call also does what ours does around the decoder: it splits the texts
    with the same vocabulary and joins the output tokens into texts."""
    options = dict(beam_size=beam, min_decoding_length=steps, max_decoding_length=steps)
    split = {key: dict(max_batch_size=-(-len(texts) // int(key[2][:-1]))) if key[2].endswith("w") else {}
             for key in loaded}  # CT2's workers take chunks of max_batch_size inputs each
    source, target = model.vocabularies["source"], model.vocabularies["target"]
    tokens = source_tokens(texts, source, model.spec)

    def ct2_text_call(runner: Any, chunks: dict[str, int]) -> Ids:
        ids = ct2_ids(runner.translate_batch(source_tokens(texts, source, model.spec), **options, **chunks), model)
        for row in ids:
            target.decode(row)  # the text a caller gets back, as ours returns it
        return ids

    def call(key: Key, runner: Any) -> Callable[[], Ids]:
        if key[0] == "ct2":
            if ct2_text:
                return lambda: ct2_text_call(runner, split[key])
            return lambda: ct2_ids(runner.translate_batch(tokens, **options, **split[key]), model)
        return lambda: [h[0].ids for h in runner.translate_batch(texts, **options)]
    return {key: [call(key, runner) for runner in runners] for key, runners in loaded.items()}


def warm_up(calls: dict[Key, list[Callable[[], Ids]]], steps: int) -> list[dict[Key, list[float]]]:
    """WARMUP rounds of one call of every copy of every decoder, interleaved as the timed rounds are (the order reversed
    every other round), each call's decoded lengths checked against `steps`. Returns each round's seconds per call,
    by decoder and copy. In rounds, not a decoder's calls in a row: a burst of load lasting one decoder's few warm-up
    calls slowed all of them (run 200: our 1-thread int8 decoder's six at 2.6 ms, against 1.42-1.48 in later runs),
    and that alone left it out."""
    rounds: list[dict[Key, list[float]]] = []
    for w in range(WARMUP):
        took: dict[Key, list[float]] = {key: [] for key in calls}
        for key in (list(calls) if w % 2 == 0 else list(calls)[::-1]):
            for call in calls[key]:
                start = time.perf_counter()
                lengths = {len(ids) for ids in call()}
                took[key].append(time.perf_counter() - start)
                if lengths != {steps}:
                    raise click.ClickException(f"{' '.join(map(str, key))} decoded lengths {sorted(lengths)}, "
                                               f"expected exactly --steps {steps} for every hypothesis")
        rounds.append(took)
    return rounds


def outclassed(rounds: list[dict[Key, list[float]]], keep_within: float) -> dict[Key, float]:
    """The configurations to leave out, with their fastest warm-up call: those whose fastest call (any copy) was
    over `keep_within` times their side's fastest (the same precision) in every warm-up round after the first (each
    copy's first call sets it up), each round judged on its own calls, taken close together, as a paired ratio."""
    judged = rounds[1:]

    def over(key: Key, took: dict[Key, list[float]]) -> bool:
        side = min(min(t) for k, t in took.items() if k[:2] == key[:2])
        return min(took[key]) > keep_within * side
    return {key: min(min(took[key]) for took in judged) for key in rounds[0]
            if all(over(key, took) for took in judged)}


def measure(calls: dict[Key, list[Callable[[], Ids]]], repeats: int, steps: int, inner: int,
            keep_within: float = KEEP_WITHIN) -> tuple[dict[Key, list[float]], int, dict[Key, float]]:
    """Seconds per call of each decoder over `repeats` interleaved rounds (each round: `inner` calls of each decoder
    in a row, their mean; round r runs copy r mod N of each of its N copies, and the decoders run in reverse order
    in rounds N..2N-1, 3N..4N-1, ..., so that every copy runs in both orders), after the warm-up rounds (`warm_up`).
    `inner` 0: enough calls for one SAMPLE_S sample of the slowest of each side's best decoder (per precision: its
    fastest configuration), each copy timed by its fastest warm-up call after its first. Not the first: a
    translator's first call sets itself up (CTranslate2's took 46 ms where its next took 0.65), which made it one
    call a round, each timed cold; nor any one later call: with mimalloc preloaded (--allocator) ours spiked once, at
    its second call (7.8 ms against 1.6), which made it two calls a round; nor a configuration far slower than its
    side's best: CTranslate2 at 2 threads took 5-17 ms at batch 1 beside our 2-thread sessions on 2 cores (1 thread:
    0.6-1.4), which made every decoder one cold call a sample, ours 1.05 ms there against 0.83 warm.
    Only contenders are timed (`outclassed`): a configuration far slower than its side's fastest in every warm-up
    round cannot be that side's best, and running it between the others slowed them (KEEP_WITHIN). Returns the
    times, the calls a sample, and the fastest warm-up call of each configuration left out."""
    rounds = warm_up(calls, steps)
    warm = {key: max(min(took[key][c] for took in rounds[1:]) for c in range(len(copies)))
            for key, copies in calls.items()}  # the slowest copy's fastest call (sizes the samples)
    best: dict[tuple[str, str], float] = {}  # (side, precision) -> its fastest configuration's warm call
    for (side, precision, _), took in warm.items():
        best[side, precision] = min(best.get((side, precision), took), took)
    inner = inner or max(1, round(SAMPLE_S / max(best.values())))  # the same for every decoder of a case
    left_out = outclassed(rounds, keep_within)
    timed = [key for key in calls if key not in left_out]
    times: dict[Key, list[float]] = {key: [] for key in timed}
    copies = max(len(c) for c in calls.values())  # every decoder has as many (`load`)
    for r in range(repeats):
        for key in (timed if (r // copies) % 2 == 0 else timed[::-1]):
            call = calls[key][r % len(calls[key])]
            start = time.perf_counter()
            for _ in range(inner):
                call()
            times[key].append((time.perf_counter() - start) / inner)
    return times, inner, left_out


def summarise(batch: int, beam: int, times: dict[Key, list[float]]) -> dict[str, Any]:
    """A case's medians per decoder, each side's best configuration, and the ratios seq2onnx / CT2: of the medians,
    and the median of each round's (paired)."""
    medians = {key: statistics.median(t) for key, t in times.items()}
    row: dict[str, Any] = {"batch": batch, "beam": beam, "decoders": [
        {"side": s, "precision": p, "config": t, "median_s": m, "times_s": times[s, p, t]}
        for (s, p, t), m in medians.items()]}
    for precision in PRECISIONS:
        for side in ("seq2onnx", "ct2"):
            best = min((m, t) for (s, p, t), m in medians.items() if (s, p) == (side, precision))
            row[f"{side}_{precision}"] = {"median_s": best[0], "config": best[1]}
        ours, theirs = row[f"seq2onnx_{precision}"], row[f"ct2_{precision}"]
        row[f"ratio_{precision}"] = ours["median_s"] / theirs["median_s"]
        row[f"paired_{precision}"] = statistics.median(
            a / b for a, b in zip(times["seq2onnx", precision, ours["config"]],
                                  times["ct2", precision, theirs["config"]], strict=True))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """| case | seq2onnx fp32 | CT2 fp32 | ratio | paired | seq2onnx int8 | CT2 int8 | ratio | paired | calls a
    sample |, ms at the best configuration."""
    def cell(entry: dict[str, Any]) -> str:
        return f"{entry['median_s'] * 1e3:.2f} ms ({entry['config']})"

    lines = ["| case | seq2onnx fp32 | CT2 fp32 | ratio | paired | seq2onnx int8 | CT2 int8 | ratio | paired | "
             "calls a sample |", "|---" * 10 + "|"]
    for r in rows:
        lines.append(f"| batch {r['batch']} beam {r['beam']} | {cell(r['seq2onnx_fp32'])} | {cell(r['ct2_fp32'])} | "
                     f"{r['ratio_fp32']:.2f} | {r['paired_fp32']:.2f} | {cell(r['seq2onnx_int8'])} | "
                     f"{cell(r['ct2_int8'])} | {r['ratio_int8']:.2f} | {r['paired_int8']:.2f} | {r['inner']} |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, the SIMD flags that matter for int8, load (`uptime`) and versions."""
    model, flags = cpu_model()
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        uptime = f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    return {"cpu": model, "flags": {f: f in flags for f in CPU_FLAGS},
            "cpus": len(os.sched_getaffinity(0)), "uptime": uptime, "ctranslate2": ctranslate2.__version__,
            "onnxruntime": ort.__version__}


def plot(rows: list[dict[str, Any]], path: Path, force: bool) -> None:
    """Left: each case's four best medians, labelled in ms (log scale, bars from a decade below the least, so their
    lengths compare as ratios). Right: the paired ratios seq2onnx / CT2, fp32 and int8, against 1 (level)."""
    import matplotlib
    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    names = [("seq2onnx_fp32", "seq2onnx fp32"), ("ct2_fp32", "CT2 fp32"), ("seq2onnx_int8", "seq2onnx int8"),
             ("ct2_int8", "CT2 int8")]
    cases, x = [f"b{r['batch']} beam {r['beam']}" for r in rows], np.arange(len(rows))
    fig, (times, ratios) = plt.subplots(1, 2, figsize=(2.6 * len(rows) + 4, 4.2),
                                        gridspec_kw={"width_ratios": [2, 1]})
    every = [r[key]["median_s"] * 1e3 for r in rows for key, _ in names]
    for i, (key, label) in enumerate(names):
        values = [r[key]["median_s"] * 1e3 for r in rows]
        bars = times.bar(x + (i - 1.5) * 0.2, values, 0.2, label=label)
        times.bar_label(bars, [f"{v:.2f}" if v < 10 else f"{v:.1f}" for v in values], fontsize=6, rotation=90,
                        padding=2)
    times.set_yscale("log")
    times.set_ylim(min(every) / 10, max(every) * 4)  # bars from a decade below the least; room for the labels
    times.set_xticks(x, cases)
    times.set_ylabel("ms per call (median, best configuration)")
    times.legend(fontsize=8, loc="upper left")
    for i, precision in enumerate(PRECISIONS):
        values = [r[f"paired_{precision}"] for r in rows]
        bars = ratios.bar(x + (i - 0.5) * 0.35, values, 0.35, label=precision)
        ratios.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=7, label_type="center", rotation=90)  # clear of 1
    ratios.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ratios.set_xticks(x, cases, rotation=30, ha="right")
    ratios.set_ylabel("seq2onnx / CT2, paired (> 1: seq2onnx slower)")
    ratios.legend(fontsize=8)
    fig.tight_layout()
    publish(path, force, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """'1,64' -> [1, 64], each >= 1 (a beam at most MAX_BEAM, a batch at most MAX_LIST_BATCH); an empty item
    ('1,,5') is refused."""
    parts = value.split(",")
    if any(not part.strip() for part in parts):
        raise click.BadParameter(f"expected comma-separated integers, got {value!r} (an empty item)")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if min(numbers) < 1:
        raise click.BadParameter(f"expected integers >= 1, got {value!r}")
    most = {"beams": MAX_BEAM, "batches": MAX_LIST_BATCH}.get(param.name or "")
    if most is not None and max(numbers) > most:
        raise click.BadParameter(f"expected integers up to {most}, got {max(numbers)}")
    return list(dict.fromkeys(numbers))  # each once, in the order given


def thread_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """int_list, each at most the CPUs this process may use (more oversubscribes them; Seq2Seq.load refuses it)."""
    numbers = int_list(ctx, param, value)
    if max(numbers) > max_threads():
        raise click.BadParameter(f"expected at most the {max_threads()} CPUs this process may use, got {value!r}")
    return numbers


def factor(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """--keep-within: a number >= 1 (FloatRange lets NaN through, which would time every configuration)."""
    if math.isnan(value):
        raise click.BadParameter(f"expected a number >= 1 (a large one, or inf, times every configuration), got "
                                 f"{value!r}")
    return value


def check_outputs(json_out: Path | None, plot_out: Path | None, force: bool) -> None:
    """--json and --plot: an existing folder, a .png plot, two different files, and no existing file replaced
    without --force."""
    if json_out is not None and plot_out is not None and json_out.resolve() == plot_out.resolve():
        raise click.BadParameter(f"{plot_out} is the --json file too; pass two different files",
                                 param_hint="'--plot'")
    check_click(json_out, "--json", force, JSON)
    check_click(plot_out, "--plot", force, PNG)


@click.command(cls=StoppableCommand)
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A transformer checkpoint (seq2onnx train --arch transformer).")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Output tokens per hypothesis (min = max decoding length).")
@click.option("--repeats", type=click.IntRange(min=1), default=24, show_default=True,
              help="Timed rounds per case (a multiple of 2 x --instances times every copy equally).")
@click.option("--inner", type=click.IntRange(min=0), default=0, show_default=True,
              help="Calls of each decoder in a row per round, their mean one sample (a service under steady load "
                   "keeps its model in cache); 0: enough for ~20 ms, the same for every decoder of a case.")
@click.option("--batches", default="1,64", show_default=True, callback=int_list, help="Batch sizes, comma-separated.")
@click.option("--beams", default="1,5", show_default=True, callback=int_list, help="Beam sizes (1: greedy).")
@click.option("--threads", default="1,2", show_default=True, callback=thread_list,
              help="Intra-op thread counts; each side is reported at its best configuration.")
@click.option("--workers", default="1", show_default=True, callback=thread_list,
              help="Worker counts (copies of 1 thread each, decoding chunks of a call at once: CT2's inter_threads); "
                   "1 adds nothing.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write every figure (each decoder's times, the cross-check, the machine) here.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a chart (PNG) of the best medians and the paired ratios here.")
@click.option("--force", is_flag=True, help="Replace an existing --json / --plot file.")
@click.option("--instances", "instances", metavar="N", type=click.IntRange(1, 8), default=3, show_default=True,
              help="Copies of every decoder, loaded in turn; round r times copy r mod N (two sessions of one graph can "
                   "run several % apart for a whole run). N times the memory and load time; --repeats a multiple "
                   "of 2N times every copy equally, in both orders.")
@click.option("--keep-within", type=click.FloatRange(min=1.0), default=KEEP_WITHIN, show_default=True, callback=factor,
              help="Time only the configurations whose fastest warm-up call was within this factor of their side's "
                   "fastest (the same precision) in some warm-up round after the first; the others cannot be that "
                   "side's best, and running them between the rest slowed it. A large value (1e9, or inf) times "
                   "every configuration.")
@click.option("--ct2-text", is_flag=True,
              help="Time CT2 text in, text out, as seq2onnx's translate_batch is: its call also splits the source "
                   "texts into tokens with the model's vocabulary and joins the output tokens into texts.")
@click.option("--allocator", default="system", show_default=True,
              help="The process's C allocator, both engines': system, mimalloc, auto or a library to preload "
                   "(cli.allocator); the script starts itself again with it.")
def main(checkpoint: Path, steps: int, repeats: int, inner: int, batches: list[int], beams: list[int],
         threads: list[int], workers: list[int], json_out: Path | None, plot_out: Path | None, force: bool,
         keep_within: float, ct2_text: bool, instances: int, allocator: str) -> None:
    """Cross-check seq2onnx and CTranslate2 on CHECKPOINT, then time both (see the module docstring)."""
    def note(line: str) -> None:
        click.echo(line, err=True)

    malloc = choose_allocator(allocator)
    check_outputs(json_out, plot_out, force)  # before a minute of work, not after
    if plot_out is not None:
        try:
            require_matplotlib()
        except MissingExtraError as err:
            raise click.ClickException(str(err)) from None
    info = machine()
    info["allocator"] = malloc
    note(f"{info['cpu']}, {info['cpus']} CPUs, flags {info['flags']}, {malloc}\nuptime: {info['uptime']}")
    with tempfile.TemporaryDirectory(prefix="ct2-bench-") as tmp:
        dirs, (check_texts, texts) = prepare(checkpoint, Path(tmp), steps, note)
        model = Seq2Seq.load(dirs["fp32"], provider="cpu")
        translator = ctranslate2.Translator(str(dirs["ct2"]), device="cpu", compute_type="float32")
        check = cross_check(model, translator, check_texts, steps)
        note(f"cross-check (fp32, {len(check_texts)} held-out sources): {json.dumps(check)}")
        wrong = check_failures(check)
        if wrong:
            raise click.ClickException("seq2onnx and CTranslate2 disagree: " + "; ".join(wrong))
        if repeats % (2 * instances):
            note(f"note: --repeats {repeats} is not a multiple of 2 x --instances {instances}: the copies are timed "
                 "unevenly")
        configs = configurations(threads, workers)
        loaded, rows = load(dirs, configs, instances), []
        graphs = {p: sorted(loaded["seq2onnx", p, configs[0]][0].manifest.graphs) for p in PRECISIONS}
        note(f"seq2onnx graphs: {graphs}")
        for batch in batches:
            batch_texts = (texts * (batch // len(texts) + 1))[:batch]
            for beam in beams:
                note(f"timing batch {batch} beam {beam}: {WARMUP} warm-up rounds of {4 * len(configs)} decoders "
                     f"({instances} cop{'ies' if instances > 1 else 'y'} each), then {repeats} rounds of those "
                     "kept ...")
                calls = decoders(loaded, model, batch_texts, beam, steps, ct2_text)
                times, calls_a_sample, left_out = measure(calls, repeats, steps, inner, keep_within)
                rows.append({**summarise(batch, beam, times), "inner": calls_a_sample,
                             "left_out": [{"side": s, "precision": p, "config": t, "fastest_warm_up_s": took}
                                          for (s, p, t), took in left_out.items()]})
                note(f"  {calls_a_sample} call(s) of each timed decoder a sample"
                     + (f"; not timed (over {keep_within:g}x its side's fastest in every warm-up round after "
                        "the first; its fastest warm-up call): "
                        + ", ".join(f"{s} {p} {t} {took * 1e3:.2f} ms" for (s, p, t), took in left_out.items())
                        if left_out else ""))
    click.echo(f"{info['cpu']}; {info['flags']}; {malloc}; uptime: {machine()['uptime']}")
    click.echo(f"{steps} tokens per hypothesis, sources of {SOURCE_TOKENS} tokens + </s>; medians of {repeats} "
               f"rounds over {instances} cop{'ies' if instances > 1 else 'y'} of each decoder; "
               "ratio = seq2onnx / CT2 (> 1: seq2onnx slower); CT2 "
               + ("text in, text out (--ct2-text)" if ct2_text else "tokens in, tokens out"))
    click.echo(table(rows))
    if json_out is not None:
        figures = {"machine": info, "uptime_after": machine()["uptime"], "steps": steps, "repeats": repeats,
                   "instances": instances, "warm_up_rounds": WARMUP,
                   "keep_within": keep_within if math.isfinite(keep_within) else None,  # None: inf, none left out
                   "ct2_io": "text" if ct2_text else "tokens",
                   "source_tokens": SOURCE_TOKENS, "graphs": graphs, "cross_check": check, "cases": rows}
        text = json.dumps(figures, indent=2, sort_keys=True) + "\n"
        publish(json_out, force, lambda f: f.write(text.encode("utf-8")))
        note(f"wrote {json_out}")
    if plot_out is not None:
        plot(rows, plot_out, force)
        note(f"wrote {plot_out}")


if __name__ == "__main__":
    main()
