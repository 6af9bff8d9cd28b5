"""`seq2onnx infer`: decode sources from a file or stdin with an exported model (no torch needed).

Point models read numeric sources (.npy, .npz, JSON) and print one JSON document; token models read text
(--text, or one input per line) and print JSON lines, see `cli.infer_tokens` and `runtime.infer_tokens`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

from runtime.atomic_file import write_file
from runtime.cuda import MAX_DEVICE_ID
from runtime.defaults import MAX_TARGET_LEN
from runtime.destination import OutputFileError, check_output_file
from runtime.errors import InputError, ResourceError, Seq2OnnxError
from runtime.infer_records import json_line
from runtime.infer_tokens import TOKEN_OUTPUT_SUFFIXES, TokenRun, read_items
from runtime.sessions import DEFAULT_MAX_THREADS, PROVIDERS

from .common import print_results, say, user_errors, wrote
from .infer_points import InputFileError, read_input, results_too_large
from .infer_tokens import (
    argv_text,
    check_token_usage,
    decoding_options,
    model_kind,
    refuse_token_options,
    token_options,
)
from .options import IntRange, address_option, check_device_option, check_threads_option, check_workers_option
from .ray_job import RayJob, infer_on_ray_checked

OUTPUT_SUFFIXES = (".json", ".npy", ".npz")
THREADS_HELP = ("onnxruntime intra-op threads, 1 to the number of usable CPUs.  [default: the usable CPUs, at "
                f"most {DEFAULT_MAX_THREADS}]")  # runtime.sessions.default_threads; eval's too
PLOT_SUFFIXES = (".png",)


def check_output_path(path: str, option: str, suffixes: tuple[str, ...], force: bool) -> None:
    """Before any work: a known suffix, an existing directory to write into, and no file replaced unless forced
    (runtime.destination.check_output_file); a file already there is exit 1, like train/export --out."""
    try:
        check_output_file(path, force, suffixes)
    except OutputFileError as exc:
        if exc.exists:
            name = option.strip("'")
            raise click.ClickException(f"{name}: {exc}") from None
        raise click.BadParameter(str(exc), param_hint=option) from None


def check_outputs(input_path: str, output_path: str | None, plot_path: str | None, attention: bool,
                  force: bool, suffixes: tuple[str, ...] = OUTPUT_SUFFIXES) -> None:
    """Refuse unusable --output / --plot paths before any decoding."""
    if output_path is not None:
        check_output_path(output_path, "'--output'", suffixes, force)
        if Path(output_path).suffix.lower() == ".npy" and attention:
            raise click.BadParameter("a .npy file holds one array; use .json or .npz with --attention",
                                     param_hint="'--output'")
    if plot_path is not None:
        check_output_path(plot_path, "'--plot'", PLOT_SUFFIXES, force)
        from runtime.plot import require_matplotlib

        require_matplotlib()
    named = [p for p in (output_path, plot_path) if p]
    if len({Path(p).resolve() for p in named}) < len(named):
        raise click.BadParameter(f"--output and --plot both name {named[0]}; give them different files")
    source = None if input_path == "-" else Path(input_path).resolve()
    for flag, path in (("--output", output_path), ("--plot", plot_path)):
        if source is not None and path and Path(path).resolve() == source:
            through = "" if path == input_path else f" ({input_path}, through a link or another spelling)"
            raise click.BadParameter(f"{path}: is the --input file{through}; write results to another file",
                                     param_hint=f"'{flag}'")


def write_atomically(path: str, write: Callable[[Any], None], force: bool) -> None:
    """Write through a temporary sibling and rename, so a failure never leaves half a file; a file that appeared
    there during the run is kept unless `force`; a failed write (a full disk, a file system that takes no new
    files) is one line, exit 1."""
    try:
        write_file(path, write, replace=force)
    except FileExistsError:
        raise click.ClickException(f"{path}: a file appeared there while this ran; it was kept and nothing was "
                                   "written (pass --force to replace it)") from None
    except OSError as exc:
        if isinstance(exc, Seq2OnnxError):  # the decode the writer streams (a ResourceError): not the file's
            raise
        raise click.ClickException(f"{path}: could not be written ({exc.strerror or exc}); nothing was written "
                                   "there") from None


def write_output(path: str, outputs: np.ndarray, attention: np.ndarray | None, providers: list[str],
                 force: bool) -> None:
    """Write results as .json, .npy (outputs only) or .npz."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        text = json.dumps(as_json(outputs, attention, providers)) + "\n"
        write_atomically(path, lambda f: f.write(text.encode("utf-8")), force)
    elif suffix == ".npy":
        write_atomically(path, lambda f: np.save(f, outputs), force)
    else:
        arrays = {"outputs": outputs, **({} if attention is None else {"attention": attention})}
        write_atomically(path, lambda f: np.savez(f, **arrays), force)


def as_json(outputs: np.ndarray, attention: np.ndarray | None, providers: list[str]) -> dict[str, Any]:
    """The JSON document infer prints."""
    return {"outputs": outputs.tolist(), "providers": providers,
            **({} if attention is None else {"attention": attention.tolist()})}


@click.command(short_help="Decode points or texts with an exported model (no torch needed).")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--input", "input_path", type=click.Path(exists=True, allow_dash=True, dir_okay=False),
              help="Point models: .npy (N, L, F), .npz with 'source' [and 'source_mask'], .json nested lists or "
                   "{'source': ..., 'source_mask': ...}; '-' reads JSON from stdin. Token models: UTF-8 text, one "
                   "input per line (blank lines skipped); '-' reads the lines from stdin.")
@click.option("--text", "texts", multiple=True, callback=lambda ctx, param, values: tuple(map(argv_text, values)),
              help="Token models: one input text (repeatable), instead of --input.")
@click.option("--target-len", type=IntRange(1, MAX_TARGET_LEN), default=None,
              help="Points to decode (default: the model's target_len).")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider; 'cuda' fails clearly where CUDA cannot run.")
@click.option("--attention", is_flag=True, help="Also return the attention weights.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
              help="Write results to FILE.json, FILE.npy or FILE.npz (token models: FILE.jsonl) instead of stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw the first items' attention (point models: and points) to FILE.png (needs matplotlib).")
@click.option("--threads", type=int, default=None, callback=check_threads_option, help=THREADS_HELP)
@click.option("--workers", type=IntRange(min=1), default=1, show_default=True,
              help="Copies of the model, one thread each (with --threads: that many each): token models decode "
                   "N batches at once, point models split the input from 64 sources (not int8 ones); the output is "
                   "the same.")
@click.option("--device-id", type=IntRange(0, MAX_DEVICE_ID), default=0, show_default=True,
              help="With --provider cuda/auto on a CUDA build: the GPU to run on (its ordinal).")
@click.option("--fused/--no-fused", default=True, show_default=True,
              help="Greedy decoding in the export's greedy loop graph, and a transformer's beam search in its beam "
                   "graph, one onnxruntime call per batch; --no-fused runs the step loop, one call per output. "
                   "Float32 exports: the same outputs within float32 rounding (the graphs sum in another order: "
                   "scores and points may differ in the last digits, and two hypotheses whose scores tie to that "
                   "rounding may swap places; the tokens are checked equal at export). A transformer's int8 export: "
                   "its beam and loop graphs multiply in float32 over the int8 weights where the step loop's "
                   "encoder (fast_encoder) multiplies in int8 (the manifest's precision), so the tokens may differ "
                   "as int8 outputs do between graphs; the export's quality report judges each. "
                   "Exports without the graphs, and sampling, always use the step loop.")
@click.option("--force", is_flag=True, help="Replace existing --output / --plot files.")
@click.option("--ray", "on_ray", is_flag=True,
              help="Decode on Ray Data, one model per actor, into --output FILE.jsonl (needs the 'serve' extra).")
@click.option("--address", default=None, callback=address_option,
              help="With --ray: join this Ray cluster (HOST:PORT of its head, or auto); MODEL_DIR is shipped to its "
                   "nodes. Default: start a local Ray on this machine's CPUs.")
@click.option("--concurrency", type=IntRange(min=1), default=None,
              help="With --ray: actors, each holding the model on --threads CPUs (default 1); default: as many as "
                   "the cluster's CPUs hold, at most one per block of inputs.")
@token_options
@user_errors
def infer(model_dir: Path, input_path: str | None, texts: tuple[str, ...], target_len: int | None, provider: str,
          attention: bool, output_path: str | None, plot_path: str | None, threads: int | None, workers: int,
          device_id: int, fused: bool, force: bool, on_ray: bool, address: str | None, concurrency: int | None,
          **decoding: Any) -> None:
    """Decode the sources in --input (token models: or the --text values) with the exported model in MODEL_DIR.

    Token models print one JSON line per input: {"index" (from 0), "source", "hypotheses": [{"text", "tokens",
    "score", "log_prob", "finish_reason" ("eos", or "length": cut at --max-len)[, "attention"]}, ...][,
    "source_tokens"]}. With --ray, point models write one JSON line per item: {"index", "outputs"[, "attention"]}."""
    from runtime.model import Seq2Seq

    check_workers_option(workers, threads, on_ray or address is not None or concurrency is not None)
    check_device_option(click.get_current_context(), provider)
    if on_ray or address is not None or concurrency is not None:
        return infer_on_ray_checked(click.get_current_context(), RayJob(
            model_dir=model_dir, input_path=input_path, texts=texts, target_len=target_len, provider=provider,
            attention=attention, output_path=output_path, plot_path=plot_path, threads=threads, fused=fused,
            force=force, on_ray=on_ray, address=address, concurrency=concurrency, decoding=decoding))
    if model_kind(model_dir) == "tokens":
        return _infer_tokens(model_dir, input_path, texts, provider, attention, output_path, plot_path,
                             (threads, workers), device_id, fused, force, decoding)
    refuse_token_options(click.get_current_context(), model_dir, input_path)
    check_outputs(input_path, output_path, plot_path, attention, force)
    source, mask = read_input(input_path)
    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=threads, fused=fused, device_id=device_id,
                             workers=workers)
    except Seq2OnnxError as exc:  # the model or the options, not the input
        raise click.ClickException(str(exc)) from None
    _note_unused_device(provider, device_id, model.providers)
    if attention and not model.spec.has_attention:  # as a token model's run refuses it
        raise click.UsageError(f"--attention: {model_dir} has no attention (its spec says attention 'none'), so "
                               "there are no weights to return; drop --attention")
    try:
        outputs, alphas = model.predict(source, target_len=target_len, source_mask=mask, return_attention=True)
    except InputError as exc:  # what the file holds (its shape, values, mask): named with the file
        raise InputFileError.of(input_path, exc) from None
    except ResourceError as exc:  # what it holds, too much of it
        raise InputFileError.short_of_memory(input_path, exc, target_len or model.spec.target_len) from None
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path and len(outputs) == 0:
        say(f"note: the input holds no items, so nothing was drawn and {plot_path} was not written")
    elif plot_path:
        from runtime.plot import plot_predictions, shown_items

        points = np.asarray(source, dtype=np.float32)  # already checked by predict
        write_atomically(plot_path, lambda f: plot_predictions(points, outputs, alphas, f), force)
        wrote(plot_path, f" ({shown_items(len(outputs))} of {len(outputs)})")
    kept = alphas if attention else None
    try:
        if output_path:
            write_output(output_path, outputs, kept, model.providers, force)
        else:
            click.echo(json.dumps(as_json(outputs, kept, model.providers)))
    except MemoryError:  # as JSON text: a staged --output is gone, and nothing was printed
        raise results_too_large(outputs, kept) from None
    if output_path:
        wrote(output_path, last=True)


def _note_unused_device(provider: str, device_id: int, providers: list[str]) -> None:
    """--device-id with --provider auto where auto found no GPU: said, not refused (a script that runs on machines
    with and without GPUs passes both), where --provider cpu refuses it (check_device_option)."""
    given = click.get_current_context().get_parameter_source("device_id") is not click.core.ParameterSource.DEFAULT
    if provider == "auto" and given and "CUDAExecutionProvider" not in providers:
        say(f"note: --device-id {device_id} picks a GPU, and --provider auto found no CUDA here (the model runs on "
            f"{', '.join(providers)}), so it changed nothing")


def _infer_tokens(model_dir: Path, input_path: str | None, texts: tuple[str, ...], provider: str, attention: bool,
                  output_path: str | None, plot_path: str | None, cpus: tuple[int | None, int], device_id: int,
                  fused: bool, force: bool, decoding: dict[str, Any]) -> None:
    """Token models: texts in, one JSON line per input out (stdout, or --output written whole). `cpus`: --threads
    and --workers."""
    from runtime.model import Seq2Seq

    ctx = click.get_current_context()
    check_token_usage(ctx, model_dir, input_path, texts)
    options = decoding_options(ctx, decoding)
    check_outputs(input_path or "-", output_path, plot_path, attention, force, TOKEN_OUTPUT_SUFFIXES)
    threads, workers = cpus
    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=threads, fused=fused, device_id=device_id,
                             workers=workers)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    _note_unused_device(provider, device_id, model.providers)
    run = TokenRun(model, options, decoding["batch_size"], attention, plot_path is not None)
    run.check(model_dir)
    # progress on stderr with --output; a line that cannot be written is dropped (`say`): it made the run fail
    docs = run.records(read_items(input_path, texts), say if output_path else None)
    lines = (json_line(doc) + "\n" for doc in docs)
    if output_path:
        write_atomically(output_path, lambda f: f.writelines(line.encode("utf-8") for line in lines), force)
        wrote(output_path, f" ({run.decoded} input{'' if run.decoded == 1 else 's'})", last=plot_path is None)
    else:
        print_results(lines)
    if run.skipped:
        say(run.skipped_note())
    if run.unknown.count:
        say(run.unknown.note())
    if run.decoded == 0:
        where = "stdin" if input_path == "-" else input_path
        say(f"note: {where} held no text, so nothing was decoded")
    if plot_path and not run.shown:
        say(f"note: there were no inputs, so nothing was drawn and {plot_path} was not written")
    elif plot_path:
        from runtime.plot import plot_heatmaps, shown_inputs

        title = f"attention of the best hypothesis: {shown_inputs(len(run.shown), run.decoded)}"
        write_atomically(plot_path, lambda f: plot_heatmaps(run.heatmaps(), title, f), force)
        wrote(plot_path, last=True)
