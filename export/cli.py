"""`seq2onnx export` and `seq2onnx verify`. Importable without torch: heavy imports are in the bodies."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from runtime.cli import FiniteFloatRange, require_torch
from runtime.errors import Seq2OnnxError
from training.cli import check_data_option

# Same values as export.parity's constants, which need torch to import (a test keeps them equal).
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
DEFAULT_DRIFT_ATOL = 1e-3
# Same values as export.quality's and export.quantize's constants (a test keeps them equal).
DEFAULT_MAX_OUTPUT_DIFF = 0.05
DEFAULT_MAX_ATTENTION_DIFF = 0.05
DEFAULT_MIN_EXACT_MATCH = 0.99
DEFAULT_MIN_TOKEN_AGREEMENT = 0.99
QUANTIZATIONS = ("int8",)
DTYPES = ("fp32", "fp16")
QUALITY_OPTIONS = ("max_output_diff", "max_attention_diff", "min_exact_match", "min_token_agreement")


def tolerance_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--atol, --rtol and --drift-atol, shared by export and verify."""
    options = [
        click.option("--atol", type=FiniteFloatRange(min=0), default=DEFAULT_ATOL, show_default=True,
                     help="Absolute tolerance for every graph output, given identical inputs."),
        click.option("--rtol", type=FiniteFloatRange(min=0), default=DEFAULT_RTOL, show_default=True,
                     help="Relative tolerance: an element passes when |ort - torch| <= atol + rtol * |torch|."),
        click.option("--drift-atol", type=FiniteFloatRange(min=0), default=DEFAULT_DRIFT_ATOL, show_default=True,
                     help="Absolute tolerance for the free-running greedy decode, where float32 rounding is fed "
                          "back step after step."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
DEFAULT_OPSET = 17


def precision_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--quantize, --dtype, --accept-quality-loss and the quality tolerances of a reduced-precision export."""
    options = [
        click.option("--quantize", type=click.Choice(QUANTIZATIONS), default=None,
                     help="Quantize the weights of MatMul/Gemm, embeddings and LSTM to int8, activations per call "
                          "(onnxruntime dynamic quantization, for CPUs; an encoder's GRU op stays float32)."),
        click.option("--dtype", type=click.Choice(DTYPES), default="fp32", show_default=True,
                     help="Weights and compute in float16 (for CUDA), inputs and outputs still float32."),
        click.option("--accept-quality-loss", is_flag=True,
                     help="Publish a --quantize/--dtype export even when it loses more than the tolerances "
                          "below against its float32 graphs (with a warning; the manifest records it)."),
        click.option("--max-output-diff", type=FiniteFloatRange(min=0), default=DEFAULT_MAX_OUTPUT_DIFF,
                     show_default=True, help="Point models: the largest output difference from float32, as a "
                                             "fraction of the outputs' largest magnitude."),
        click.option("--max-attention-diff", type=FiniteFloatRange(min=0), default=DEFAULT_MAX_ATTENTION_DIFF,
                     show_default=True, help="Point models: the largest attention-weight difference from float32."),
        click.option("--min-exact-match", type=FiniteFloatRange(0, 1), default=DEFAULT_MIN_EXACT_MATCH,
                     show_default=True, help="Token models: the least fraction of decoded sequences (greedy and "
                                             "beam 5) identical to float32's."),
        click.option("--min-token-agreement", type=FiniteFloatRange(0, 1), default=DEFAULT_MIN_TOKEN_AGREEMENT,
                     show_default=True, help="Token models: the least fraction of output positions equal to "
                                             "float32's."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def check_precision(ctx: click.Context, quantize: str | None, dtype: str, accept: bool) -> None:
    """Usage errors: int8 with fp16, and quality options without a reduced precision to judge."""
    if quantize is not None and dtype != "fp32":
        raise click.UsageError(f"--quantize {quantize} and --dtype {dtype} cannot be combined: int8 quantization "
                               "works on float32 graphs; choose one")
    given = [f"--{name.replace('_', '-')}" for name in (*QUALITY_OPTIONS, "accept_quality_loss")
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if given and quantize is None and dtype == "fp32":
        verb = "applies" if len(given) == 1 else "apply"
        raise click.UsageError(f"{', '.join(given)} only {verb} to a reduced-precision export; add --quantize int8 "
                               "or --dtype fp16, or drop them")


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that describe a user's input (a bad checkpoint, export or spec), shown without a traceback."""
    from runtime.spec import SpecError
    from training.checkpoint import CheckpointError

    return Seq2OnnxError, CheckpointError, SpecError


@click.command("export", short_help="Export a checkpoint to ONNX, checked for parity first.")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to write the export to (a new one, or an earlier export with --force).")
@click.option("--opset", type=int, default=DEFAULT_OPSET, show_default=True, help="ONNX opset (14-20).")
@tolerance_options
@precision_options
@click.option("--force", is_flag=True, help="Replace an existing export at --out.")
@click.pass_context
def export_command(ctx: click.Context, checkpoint: Path, out: Path, opset: int, atol: float, rtol: float,
                   drift_atol: float, quantize: str | None, dtype: str, accept_quality_loss: bool,
                   max_output_diff: float, max_attention_diff: float, min_exact_match: float,
                   min_token_agreement: float, force: bool) -> None:
    """Export CHECKPOINT to ONNX graphs + manifest, checked for parity before anything is written.

    With --quantize int8 or --dtype fp16 the float32 graphs are checked first, then converted and compared with
    them (real test data when the checkpoint's data can be reloaded, else random inputs); an export that loses
    more than the tolerances is refused unless --accept-quality-loss."""
    check_precision(ctx, quantize, dtype, accept_quality_loss)
    require_torch()
    from training.destination import normalized

    from .api import QualityLossWarning, export_model
    from .atomic import check_destination
    from .graphs import MAX_OPSET, MIN_OPSET
    from .parity import Tolerance, format_table
    from .quality import QualityTolerance, format_quality

    tol = Tolerance(atol, rtol, drift_atol)
    quality_tol = QualityTolerance(max_output_diff, max_attention_diff, min_exact_match, min_token_agreement)
    mode = quantize or dtype
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise click.BadParameter(f"expected {MIN_OPSET}..{MAX_OPSET}, got {opset}", param_hint="'--opset'")
    if normalized(out).resolve().is_relative_to(checkpoint.resolve()):
        raise click.BadParameter(f"{out} is CHECKPOINT {checkpoint} or inside it; an export there would make the "
                                 "checkpoint hold files seq2onnx training does not write, choose a directory beside it",
                                 param_hint="'--out'")
    try:
        check_destination(normalized(out), force)  # a refused --out is said before any work
        click.echo(f"exporting {checkpoint} (opset {opset}); checking parity over the shape matrix ...", err=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", QualityLossWarning)
            path = export_model(checkpoint, out, opset=opset, tol=tol, force=force, progress=True,
                                on_parity=lambda rows: click.echo(format_table(rows, tol)),
                                quantize=quantize, dtype=dtype, quality_tol=quality_tol,
                                accept_quality_loss=accept_quality_loss,
                                on_quality=lambda rows: click.echo(format_quality(rows, quality_tol, mode)))
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a full disk, a file system that takes no new files: the staging copy is gone already
        raise click.ClickException(f"--out {out}: the export could not be written ({exc.strerror or exc}); nothing "
                                   "was written there") from None
    for warning in caught:
        if issubclass(warning.category, QualityLossWarning):
            click.echo(f"warning: {warning.message}", err=True)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    click.echo(f"wrote {path}" + ("" if mode == "fp32" else f" ({mode}, quality report in its manifest)"))


def check_verify_data(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--data names point data ('squares', PATH.npz) or text data (a built-in, PATH.tsv, SRC,TGT); which one fits
    is checked once the model's kind is known. A named file that does not exist is a usage error."""
    from training.token_cli import check_text_data

    if value is None or value == "squares":
        return value
    if value.endswith(".npz"):
        return check_data_option(ctx, param, value)
    return check_text_data(value)


@click.command("verify", short_help="Compare a checkpoint and its export (PyTorch vs onnxruntime).")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@tolerance_options
@click.option("--data", "data", default=None, callback=check_verify_data,
              help="Also compare on this data: 'squares' or PATH.npz for point models; reverse, toy-translation, "
                   "lookup, dates, PATH.tsv or SRC,TGT for token models (default: the checkpoint's training data, "
                   "when it can still be found).")
def verify_command(checkpoint: Path, model_dir: Path, atol: float, rtol: float, drift_atol: float,
                   data: str | None) -> None:
    """Compare PyTorch (CHECKPOINT) and onnxruntime (MODEL_DIR) across batches and lengths."""
    require_torch()
    from runtime.model import Seq2Seq

    from .api import load_source
    from .parity import Tolerance, format_table, matrix_cases, run_parity

    tol = Tolerance(atol, rtol, drift_atol)
    try:
        model, spec, _ = load_source(checkpoint)
        runtime = Seq2Seq.load(model_dir, provider="cpu")
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    check_pair(checkpoint, model_dir, spec, runtime)
    precision = runtime.manifest.raw.get("precision")
    if isinstance(precision, dict) and precision.get("weights", "fp32") != "fp32":
        return verify_reduced(checkpoint, model_dir, runtime, tol, data)
    if spec.kind == "tokens":
        rows = token_rows(checkpoint, data, model, runtime, tol)
    else:
        rows = run_parity(model, runtime, matrix_cases(spec.n_features) + dataset_cases(checkpoint, data, spec),
                          tol, progress=True)
    click.echo(format_table(rows, tol))
    failed = [r for r in rows if not r.ok]
    if failed:
        source = runtime.manifest.raw.get("source")
        raise click.ClickException(f"{len(failed)} of {len(rows)} checks exceed {tol}; {model_dir} says it was "
                                   f"exported from {source!r}: if that is not {checkpoint}, the two are not a pair")
    click.echo(f"all {len(rows)} checks within {tol}")


def verify_reduced(checkpoint: Path, model_dir: Path, runtime: Any, tol: Any, data: str | None) -> None:
    """An int8/fp16 export: export CHECKPOINT at float32 into a temporary directory (parity against PyTorch at
    --atol/--rtol/--drift-atol), then compare MODEL_DIR with it at the quality tolerances its manifest records."""
    import tempfile
    from dataclasses import fields

    from runtime.model import Seq2Seq

    from .api import checkpoint_data, export_model
    from .parity import format_table
    from .quality import QualityTolerance, failures, format_quality, quality_report

    if data is not None and (data == "squares" or data.endswith(".npz")) != (runtime.spec.kind == "points"):
        raise click.BadParameter(f"{data!r} does not fit {checkpoint}, a {runtime.spec.kind} model",
                                 param_hint="'--data'")
    recorded = runtime.manifest.raw.get("quality")
    recorded = recorded if isinstance(recorded, dict) else {}
    try:
        qtol = QualityTolerance(**{f.name: recorded[f.name] for f in fields(QualityTolerance) if f.name in recorded})
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"{model_dir}: the manifest's quality tolerances are unreadable ({exc}); "
                                   "re-export the model") from None
    mode = runtime.manifest.raw["precision"]["weights"]
    click.echo(f"{model_dir} is an {mode} export: checking a float32 export of {checkpoint} against PyTorch, then "
               f"{model_dir} against that float32 export ({qtol})", err=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            reference = Seq2Seq.load(export_model(checkpoint, Path(tmp) / "fp32", tol=tol, progress=True,
                                                  on_parity=lambda rows: click.echo(format_table(rows, tol))),
                                     provider="cpu")
            candidate = Seq2Seq.load(model_dir, provider="auto")  # a GPU measures fp16 where it is meant to run
            rows = quality_report(reference, candidate, qtol, checkpoint_data(checkpoint, runtime.spec, data))
        except user_errors() as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{model_dir} ran on {candidate.providers[0]}", err=True)
    click.echo(format_quality(rows, qtol, mode))
    failed = failures(rows)
    if failed:
        accepted = " (it was published with --accept-quality-loss)" if recorded.get("accepted_beyond_tolerance") else ""
        raise click.ClickException(f"{len(failed)} checks exceed the quality tolerances of {model_dir}{accepted}")
    click.echo(f"float32 parity and all {mode} quality checks within tolerance")


def check_pair(checkpoint: Path, model_dir: Path, spec: Any, runtime: Any) -> None:
    """The export must come from a model of the checkpoint's spec, and (tokens) with its vocabularies."""
    if runtime.spec != spec:
        mine, theirs = dataclasses.asdict(spec), dataclasses.asdict(runtime.spec)  # defaults shown, not None
        fields = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        shown = ", ".join(f"{k}: {mine.get(k)!r} vs {theirs.get(k)!r}" for k in fields)
        raise click.ClickException(f"{checkpoint} and {model_dir} hold different models ({shown}); they cannot be "
                                   "compared")
    if spec.kind == "tokens":
        from training.checkpoint import load_checkpoint_vocabularies

        try:
            mine = dict(zip(("source", "target"), load_checkpoint_vocabularies(checkpoint)))
        except user_errors() as exc:
            raise click.ClickException(str(exc)) from None
        differ = [side for side, vocab in runtime.vocabularies.items() if mine[side].sha256 != vocab.sha256]
        if differ:
            raise click.ClickException(f"the {' and '.join(differ)} vocabulary of {checkpoint} differs from "
                                       f"{model_dir}'s; the same ids would read as other text, so the two are not "
                                       "a pair")


def token_rows(checkpoint: Path, data: str | None, model: Any, runtime: Any, tol: Any) -> list:
    """Token models: the random-id matrix, then real texts (--data, else the checkpoint's own data if found):
    step log-probs within tolerance (transformers: also the cached step against the full-sequence decoder at every
    position), greedy and beam ids identical, over batch sizes and padded lengths."""
    from training.checkpoint import read_data_description
    from training.data import DataError
    from training.text_data import load_text_dataset, reload_text_dataset

    from .token_parity import fitting_texts, run_token_data_parity, run_token_parity

    if data is not None and (data == "squares" or data.endswith(".npz")):  # a usage error, before any work
        raise click.BadParameter(f"{data!r} is point data; {checkpoint} is a token model: pass a text data set",
                                 param_hint="'--data'")
    rows = run_token_parity(model, runtime, tol)
    try:
        train, test = load_text_dataset(data) if data is not None else reload_text_dataset(
            read_data_description(checkpoint) or {})
    except DataError as exc:
        if data is not None:
            raise click.ClickException(f"--data: {exc}") from None
        click.echo(f"note: the checkpoint's training data cannot be reloaded ({exc}); comparing on random ids "
                   "only (pass --data to compare on real texts)", err=True)
        return rows
    for name, pairs in (("test", test), ("train", train)):
        left_out = len(pairs.sources) - len(fitting_texts(list(pairs.sources), runtime))
        if left_out:
            click.echo(f"note: {left_out} {name} text(s) are longer than the transformer's max_positions "
                       f"{runtime.spec.max_positions} (</s> included), which the runtime refuses; comparing on "
                       "the others", err=True)
        rows += run_token_data_parity(model, runtime, list(pairs.sources), name, tol)
    return rows


def dataset_cases(checkpoint: Path, data: str | None, spec: Any) -> list:
    """Parity cases from real data: --data (read, or the command fails), else the checkpoint's own data if found."""
    from training.checkpoint import read_data_description
    from training.data import DataError, load_dataset, reload_dataset

    from .parity import data_cases

    if data is not None:
        if not (data == "squares" or data.endswith(".npz")):
            raise click.BadParameter(f"{data!r} is text data; {checkpoint} is a point model: pass 'squares' or "
                                     "PATH.npz", param_hint="'--data'")
        try:
            train, test = load_dataset(data)
        except DataError as exc:
            raise click.ClickException(f"--data: {exc}") from None
        if train.n_features != spec.n_features:
            raise click.ClickException(f"--data: {data} has {train.n_features} features per point, the model "
                                       f"expects {spec.n_features}; pass data the checkpoint was trained on")
    else:
        description = read_data_description(checkpoint)
        if description is None:
            return []
        try:
            train, test = reload_dataset(description)
        except (DataError, OSError):  # moved or edited since training: say so, compare on random inputs
            named = description.get("path", description.get("name"))
            click.echo(f"note: the checkpoint's training data {named!r} is missing or changed since training; "
                       "comparing on random inputs only (pass --data to compare on real data)", err=True)
            return []
    return data_cases("train", train.source, spec.target_len) + data_cases("test", test.source, spec.target_len)
