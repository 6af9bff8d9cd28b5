"""`seq2onnx bench`: decode latency over a grid, onnxruntime against PyTorch eager (with --checkpoint) in one run.

Importable without torch: PyTorch is imported only when --checkpoint asks for the eager side (see export.eager).
The grid's core (inputs, timing, floor, table, JSON, plot) is torch-free, in runtime.bench.
"""
from __future__ import annotations

import inspect
import json
import platform
from pathlib import Path
from typing import Any

import click
import numpy as np

from runtime.bench import (
    FORMAT,
    LOOPS,
    Cell,
    cell_record,
    floor_call,
    grid,
    identity_graph,
    make_inputs,
    measure,
    ort_call,
)
from runtime.bench_report import best_rows, describe_model, format_best, format_table, plot_latency, progress
from runtime.contract import FAST_FILES
from runtime.defaults import MAX_TARGET_LEN
from runtime.errors import Seq2OnnxError
from runtime.infer_tokens import MAX_BATCH
from runtime.search.beam import MAX_BEAM
from runtime.sessions import CPU, CUDA, PROVIDERS, max_threads

from .common import require_torch, wrote
from .eager import EAGER_NEEDS_TORCH, load_eager
from .infer import PLOT_SUFFIXES, check_output_path, write_atomically
from .options import IntRange
from .options import check_threads_option as check_threads

LOOP_CHOICES = ("auto", "step", "fused", "both")
POINT_DEFAULTS = {"batches": (1, 16, 256), "source_lens": (50,), "target_lens": (100,)}
TOKEN_BATCHES, TOKEN_BEAMS = (1, 16, 64), (1, 5)
DEFAULT_THREADS = (1, 2)
JSON_SUFFIXES = (".json",)


def unique(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """The values in the order given, each once."""
    return tuple(dict.fromkeys(values))


def check_thread_counts(ctx: click.Context, param: click.Parameter, values: tuple[int, ...]) -> tuple[int, ...]:
    """--threads: each 1 up to the usable CPUs (infer's rule); default 1 and 2 where the machine has them."""
    if not values:
        return tuple(t for t in DEFAULT_THREADS if t <= max_threads())
    return unique(tuple(check_threads(ctx, param, value) for value in values))


def resolve_grid(ctx: click.Context, model_dir: Path, spec: Any, values: dict[str, tuple[int, ...]],
                 contract: Any = None) -> dict:
    """The grid's axes: the values given, else the kind's defaults; values the model cannot take are usage errors."""
    from runtime.decode_options import decoding_limit
    from runtime.token_steps import contract_for

    axes = {name: unique(given) for name, given in values.items()}
    if spec.kind == "points":
        if axes["beams"]:
            raise click.UsageError(f"--beam: {model_dir} is a point model, which decodes greedily; beam sizes are "
                                   "for token models, drop --beam")
        return {name: axes[name] or POINT_DEFAULTS.get(name, (None,)) for name in axes}
    contract = contract_for(spec, contract)
    rules = contract.sources
    specials = int(rules.add_bos) + int(rules.add_eos)
    limit = rules.max_len - specials  # the source's own specials count too
    longest_target = decoding_limit(spec, contract)
    defaults = {"batches": TOKEN_BATCHES, "beams": TOKEN_BEAMS, "source_lens": (min(spec.input_len, limit),),
                "target_lens": (min(spec.target_len, longest_target),)}
    axes = {name: axes[name] or defaults[name] for name in axes}
    too_long = [n for n in axes["source_lens"] if n > limit]
    if too_long:
        raise click.BadParameter(f"{too_long[0]} tokens: {model_dir} reads at most {limit} source tokens (and "
                                 f"{specials} special); pass a shorter --source-len", ctx, param_hint="'--source-len'")
    too_long = [n for n in axes["target_lens"] if n > longest_target]
    if too_long:
        why = ("is a transformer with max_positions {} (output token t reads row t of its position table)"
               if spec.is_transformer else "produces at most {} tokens").format(longest_target)
        raise click.BadParameter(f"{too_long[0]}: {model_dir} {why}; pass a shorter --target-len", ctx,
                                 param_hint="'--target-len'")
    return axes


def check_destinations(json_path: str | None, plot_path: str | None, force: bool) -> None:
    """--json FILE and --plot FILE: writable, not replacing a file without --force (said before any work; their
    suffixes differ, so they never name one file)."""
    if json_path is not None and json_path != "-":
        check_output_path(json_path, "'--json'", JSON_SUFFIXES, force)
    if plot_path is not None:
        check_output_path(plot_path, "'--plot'", PLOT_SUFFIXES, force)
        from runtime.errors import MissingExtraError
        from runtime.plot import require_matplotlib

        try:
            require_matplotlib()
        except MissingExtraError as exc:
            raise click.ClickException(str(exc)) from None


def load_models(model_dir: Path, providers: tuple[str, ...], threads: tuple[int, ...],
                loop: str) -> tuple[dict[tuple[str, int, str], Any], tuple[str, ...], tuple[str, ...]]:
    """One loaded model per (provider, threads, loop), every load before any timing, the loops measured, and the
    providers the sessions run on: 'auto' as what it chose ('cpu' or 'cuda'), timed once where asked for twice."""
    from runtime.model import Seq2Seq

    supported = "fused" in inspect.signature(Seq2Seq.load).parameters  # the fused greedy loop graph, once it lands

    def load(provider: str, count: int, fused: bool) -> Any:
        extra = {"fused": fused} if supported else {}
        return Seq2Seq.load(model_dir, provider=provider, threads=count, **extra)

    models = {}
    try:
        probe = load(providers[0], threads[0], True) if supported and loop != "step" else None
        has_fused = bool(getattr(probe, "has_fused", False))  # loaded with fused=True: the export has the graph
        if loop in ("fused", "both") and not has_fused:
            why = (f"{model_dir} has no fused greedy graph (exported before it existed); re-export it" if supported
                   else "this seq2onnx runtime has no fused greedy loop (Seq2Seq.load takes no 'fused')")
            raise click.ClickException(f"--loop {loop}: {why}, or pass --loop step")
        loops = {"fused": ("fused",), "both": LOOPS, "step": ("step",)}.get(loop, LOOPS if has_fused else ("step",))
        for provider in providers:
            for count in threads:
                for kind in loops:
                    reuse = kind == "fused" and (provider, count) == (providers[0], threads[0])
                    model = probe if reuse else load(provider, count, kind == "fused")
                    models.setdefault(("cuda" if model.providers[0] == CUDA else "cpu", count, kind), model)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    return models, loops, unique(tuple(p for p, _, _ in models))


def floor_sessions(providers: tuple[str, ...], threads: tuple[int, ...]) -> dict[tuple[str, int], Any]:
    """The Identity graph's session for each (provider, threads), as the models' sessions are made."""
    from runtime.sessions import open_session

    data = identity_graph()
    try:
        return {(p, t): open_session(data, p, t, "the per-call floor's Identity graph") for p in providers
                for t in threads}
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


def run_cells(cells: list[Cell], models: dict, floors: dict, eager: Any, spec: Any, vocab: Any, warmup: int,
              repeats: int) -> list[dict[str, Any]]:
    """Measure every cell (PyTorch only where onnxruntime runs on the CPU), one progress line each on stderr."""
    inputs: dict[tuple[int, int], Any] = {}
    records = []
    for number, cell in enumerate(cells, 1):
        model = models[(cell.provider, cell.threads, cell.loop)]
        try:
            if (cell.batch, cell.source_len) not in inputs:
                inputs[(cell.batch, cell.source_len)] = make_inputs(spec, vocab, cell.batch, cell.source_len,
                                                                    contract=model.contract)
            given = inputs[(cell.batch, cell.source_len)]
            calls = {"ort": ort_call(model, cell, given), "floor": floor_call(floors[(cell.provider, cell.threads)],
                                                                             cell.calls)}
            names = {}
            if eager is not None and model.providers[0] == CPU:
                eager.set_threads(cell.threads)
                for key, (name, call) in eager.decoders(cell, given).items():
                    calls[key], names[key] = call, name
            record = cell_record(cell, model.providers, measure(calls, warmup, repeats), names)
        except Seq2OnnxError as exc:
            raise click.ClickException(f"{cell.describe()}: {exc}") from None
        click.echo(f"[{number}/{len(cells)}] {cell.describe()}: {progress(record)}", err=True)
        records.append(record)
    return records


@click.command("bench", short_help="Time decoding over a grid: onnxruntime, and PyTorch eager with --checkpoint.")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Also time PyTorch eager on this checkpoint (MODEL_DIR's source; needs the 'train' extra).")
@click.option("--batch", "batches", type=IntRange(1, MAX_BATCH), multiple=True,
              help="Batch sizes (repeatable; default 1, 16, 256 for point models, 1, 16, 64 for token models).")
@click.option("--source-len", "source_lens", type=IntRange(1, MAX_TARGET_LEN), multiple=True,
              help="Source lengths, points or tokens (repeatable; default 50, or a token model's input_len).")
@click.option("--target-len", "target_lens", type=IntRange(1, MAX_TARGET_LEN), multiple=True,
              help="Decoded points or tokens, exactly (repeatable; default 100, or a token model's target_len).")
@click.option("--beam", "beams", type=IntRange(1, MAX_BEAM), multiple=True,
              help="Token models: beam sizes, 1 = greedy (repeatable; default 1 and 5).")
@click.option("--provider", "providers", type=click.Choice(PROVIDERS), multiple=True, default=("cpu",),
              show_default=True,
              help="Execution providers (repeatable); PyTorch is timed only where onnxruntime runs on the CPU.")
@click.option("--threads", "thread_counts", type=int, multiple=True, callback=check_thread_counts,
              help="Intra-op threads of both sides (repeatable; default 1 and 2, at most the usable CPUs).")
@click.option("--loop", type=click.Choice(LOOP_CHOICES), default="auto", show_default=True,
              help="Greedy decoding through the step loop, the fused loop graph (a Loop; a point model's runs its "
                   "steps in a Scan), or both (auto: both where the model has a fused graph).")
@click.option("--repeats", type=IntRange(1, 100_000), default=20, show_default=True,
              help="Timed decodes per cell and decoder.")
@click.option("--warmup", type=IntRange(0, 1000), default=2, show_default=True,
              help="Untimed decodes per cell and decoder first.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Also write the results as JSON to FILE.json; '-' prints JSON to stdout instead of the tables.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw median latency against batch size to FILE.png (needs matplotlib).")
@click.option("--force", is_flag=True, help="Replace existing --json / --plot files.")
def bench_command(model_dir: Path, checkpoint: Path | None, providers: tuple[str, ...],
                  thread_counts: tuple[int, ...], loop: str, repeats: int, warmup: int, json_path: str | None,
                  plot_path: str | None, force: bool, **axes: tuple[int, ...]) -> None:
    """Median and p90 decode latency, sequences/s and tokens/s of MODEL_DIR over a grid of batch sizes, lengths,
    providers, threads and (token models) beam sizes, beside the per-call floor and, with --checkpoint, PyTorch
    eager on the same inputs; the last table puts each side at its best thread count."""
    import onnxruntime as ort

    from runtime.manifest import read_manifest

    try:
        manifest = read_manifest(model_dir)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    spec = manifest.spec
    if checkpoint is not None and spec.is_declared:
        raise click.UsageError(f"--checkpoint: {model_dir} is a declared model (exported with --adapter), whose "
                               "PyTorch side is your own code, not a checkpoint; drop --checkpoint to time onnxruntime")
    values = resolve_grid(click.get_current_context(), model_dir, spec, axes, manifest.contract)
    beam_graph = FAST_FILES["beam"] in manifest.graphs  # a transformer's fast graphs: beam search in one call too
    if loop == "fused" and spec.kind == "tokens" and 1 not in values["beams"] and not beam_graph:
        raise click.UsageError(f"--loop fused times the greedy loop graph, which decodes with beam 1, but the grid's "
                               f"beam sizes are {list(values['beams'])}; add --beam 1, or pass --loop step for beam "
                               "search (only a transformer's export runs a whole beam search in one graph; a recurrent model's beam "
                               "search calls its beam step graph a step at a time)")
    dropped = [b for b in values["beams"] if b > 1] if loop == "fused" and spec.kind == "tokens" else []
    if dropped and not beam_graph:
        click.echo(f"note: --loop fused times the greedy loop graph alone ({model_dir} has no beam search graph): "
                   f"the beam {', '.join(map(str, dropped))} cells are left out; pass --loop both to time beam search "
                   "through the step loop too", err=True)
    check_destinations(json_path, plot_path, force)
    if checkpoint is not None:
        require_torch(what=EAGER_NEEDS_TORCH)  # before the models load (load_eager asks again, for its other callers)
    models, loops, providers = load_models(model_dir, unique(providers), thread_counts, loop)
    first = next(iter(models.values()))
    eager = None if checkpoint is None else load_eager(checkpoint, model_dir, first)
    fused = next((m for (_, _, kind), m in models.items() if kind == "fused"), None)
    steps = getattr(fused, "token_steps", None)  # loaded with fused=True: holds the beam graph if the export has it
    beam_graph = steps is not None and steps.fast is not None and steps.fast.beam is not None
    cells = grid(providers, thread_counts, loops, values["batches"], values["source_lens"], values["target_lens"],
                 values["beams"], beam_graph)
    records = run_cells(cells, models, floor_sessions(providers, thread_counts), eager, spec,
                        first.vocabularies.get("source"), warmup, repeats)
    torch_version = None if eager is None else eager.torch_version
    doc = {"format": FORMAT, "model_dir": str(model_dir), "checkpoint": None if checkpoint is None else str(checkpoint),
           "kind": spec.kind, "spec": spec.to_dict(), "precision": manifest.precision,
           "setup": {"onnxruntime": ort.__version__, "torch": torch_version, "numpy": np.__version__,
                     "python": platform.python_version(), "machine": platform.machine(), "cpus": max_threads(),
                     "warmup": warmup, "repeats": repeats},
           "grid": {"provider": list(providers), "threads": list(thread_counts), "loop": list(loops),
                    "batch": list(values["batches"]), "source_len": list(values["source_lens"]),
                    "target_len": list(values["target_lens"]), "beam": list(values["beams"])},
           "cells": records, "best": best_rows(records)}
    write_results(doc, model_dir, spec, json_path, plot_path, force)


def write_results(doc: dict[str, Any], model_dir: Path, spec: Any, json_path: str | None,
                  plot_path: str | None, force: bool) -> None:
    """The tables on stdout (or, with --json -, the JSON), then the --json and --plot files, each written whole
    (and over a file that appeared during the run only with `force`)."""
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if json_path == "-":
        click.echo(text, nl=False)
    else:
        setup = doc["setup"]
        torch = f", torch {setup['torch']}" if setup["torch"] else " (no --checkpoint: onnxruntime only)"
        described = describe_model(spec, doc["precision"])
        click.echo(f"{model_dir}: {described}; onnxruntime {setup['onnxruntime']}{torch}; medians of "
                   f"{setup['repeats']} after {setup['warmup']} warm-up; floor = 'calls' session.run() calls of an "
                   "Identity graph; torch = PyTorch eager's own decode, timed beside each row (loop is onnxruntime's); "
                   "speed-up = torch / ort")
        click.echo(format_table(doc))
        if doc["best"]:
            click.echo("\neach side at its best thread count:")
            click.echo(format_best(doc["best"]))
    if json_path and json_path != "-":
        write_atomically(json_path, lambda f: f.write(text.encode("utf-8")), force)
        wrote(json_path, last=not plot_path)
    if plot_path:
        title = f"{model_dir}: {describe_model(spec, doc['precision'])}"
        write_atomically(plot_path, lambda f: plot_latency(doc["cells"], title, f), force)
        wrote(plot_path, last=True)
