"""`seq2onnx export` and `seq2onnx verify`. Importable without torch: heavy imports are in the bodies."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import click

from runtime.contract import MANIFEST_FILE
from runtime.defaults import (
    DEFAULT_ATOL,
    DEFAULT_DRIFT_ATOL,
    DEFAULT_OPSET,
    DEFAULT_RTOL,
    DTYPES,
    MAX_ATTENTION_DIFF,
    MAX_OUTPUT_DIFF,
    MIN_EXACT_MATCH,
    MIN_TOKEN_AGREEMENT,
    QUANTIZATIONS,
)
from runtime.errors import UsageError

from .adapters import ADAPTER_HELP, load_adapter
from .common import no_temporary_directory, publishes, require_torch, user_errors, wrote
from .options import FiniteFloatRange
from .streams import StdoutError
from .train import check_data_option

QUALITY_OPTIONS = ("max_output_diff", "max_attention_diff", "min_exact_match", "min_token_agreement")


def tolerance_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--atol, --rtol and --drift-atol, shared by export and verify."""
    options = [
        click.option("--atol", type=FiniteFloatRange(min=0), default=DEFAULT_ATOL, show_default=True,
                     help="Absolute tolerance for every graph output, given identical inputs."),
        click.option("--rtol", type=FiniteFloatRange(min=0), default=DEFAULT_RTOL, show_default=True,
                     help="Relative tolerance: an element passes when |ort - torch| <= atol + rtol * |torch|."),
        click.option("--drift-atol", type=FiniteFloatRange(min=0), default=DEFAULT_DRIFT_ATOL, show_default=True,
                     help="Point models: absolute tolerance for the free-running greedy decode (token models: "
                          "the same ids, log-probs within --atol/--rtol)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


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
        click.option("--max-output-diff", type=FiniteFloatRange(min=0), default=MAX_OUTPUT_DIFF,
                     show_default=True, help="Point models: the largest output difference from float32, as a "
                                             "fraction of the outputs' largest magnitude."),
        click.option("--max-attention-diff", type=FiniteFloatRange(min=0), default=MAX_ATTENTION_DIFF,
                     show_default=True, help="Point models: the largest attention-weight difference from float32."),
        click.option("--min-exact-match", type=FiniteFloatRange(0, 1), default=MIN_EXACT_MATCH,
                     show_default=True, help="Token models: the least fraction of decoded sequences (greedy and "
                                             "beam 5) identical to float32's."),
        click.option("--min-token-agreement", type=FiniteFloatRange(0, 1), default=MIN_TOKEN_AGREEMENT,
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
                               f"or --dtype fp16, or drop {'it' if len(given) == 1 else 'them'}")


def declared_export(path: Path) -> bool:
    """Whether `path` holds an export of a declared model (exported with --adapter)."""
    import json

    try:
        return json.loads((path / MANIFEST_FILE).read_text())["spec"].get("arch") == "declared"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@click.command("export", short_help="Export a checkpoint (or your own model) to ONNX, checked for parity first.")
@click.argument("checkpoint", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--adapter", metavar="MODULE:FUNCTION", default=None, help=ADAPTER_HELP)
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Directory to write the export to (a new one, or an earlier export with --force).")
@click.option("--opset", type=int, default=DEFAULT_OPSET, show_default=True, help="ONNX opset (14-20); a transformer's fast graphs are written at 17 whatever it says.")
@tolerance_options
@precision_options
@click.option("--force", is_flag=True, help="Replace an existing export at --out.")
@click.pass_context
def export_command(ctx: click.Context, checkpoint: Path | None, adapter: str | None, out: Path, opset: int,
                   atol: float, rtol: float, drift_atol: float, quantize: str | None, dtype: str,
                   accept_quality_loss: bool, max_output_diff: float, max_attention_diff: float,
                   min_exact_match: float, min_token_agreement: float, force: bool) -> None:
    """Export CHECKPOINT (or --adapter MODULE:FUNCTION, your own model) to ONNX graphs + manifest, checked for
    parity before anything is written.

    With --quantize int8 or --dtype fp16 the float32 graphs are checked first, then converted and compared with
    them (real test data when the checkpoint's data can be reloaded, else random inputs); an export that loses
    more than the tolerances is refused unless --accept-quality-loss."""
    if (checkpoint is None) == (adapter is None):
        raise click.UsageError("pass a CHECKPOINT to export, or --adapter MODULE:FUNCTION for your own model "
                               f"({'not both' if adapter else 'neither was given'})")
    check_precision(ctx, quantize, dtype, accept_quality_loss)
    require_torch()
    from export.api import LeftOutGraphsWarning, QualityLossWarning, RandomInputsWarning, export_model
    from export.atomic import check_destination
    from export.graphs import MAX_OPSET, MIN_OPSET
    from export.parity import Tolerance, format_table
    from export.quality_rows import QualityTolerance, format_quality
    from export.verify import input_errors
    from runtime.destination import normalized

    tol = Tolerance(atol, rtol, drift_atol)
    quality_tol = QualityTolerance(max_output_diff, max_attention_diff, min_exact_match, min_token_agreement)
    given = tuple(n for n in QUALITY_OPTIONS if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT)
    if given and checkpoint is not None:  # a bar of the other kind, even at its default: refused before any work
        spec = checkpoint_spec(checkpoint)
        try:
            quality_tol.check_kind("" if spec is None else spec.kind, given)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
        if "max_attention_diff" in given and spec is not None and not spec.has_attention:
            raise click.UsageError(f"--max-attention-diff judges attention, and {checkpoint} has none (its spec "
                                   "says attention 'none'): drop it")
    mode = quantize or dtype
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise click.BadParameter(f"expected {MIN_OPSET}..{MAX_OPSET}, got {opset}", param_hint="'--opset'")
    if checkpoint is not None and normalized(out).resolve().is_relative_to(checkpoint.resolve()):
        raise click.ClickException(f"--out {out} is CHECKPOINT {checkpoint} or inside it; an export there would make "
                                   "the checkpoint hold files seq2onnx training does not write, choose a directory "
                                   "beside it")  # exit 1, as every refused --out
    try:
        check_destination(normalized(out), force)  # a refused --out is said before any work
        source = checkpoint if checkpoint is not None else load_adapter(adapter)
        with warnings.catch_warnings(record=True) as caught, publishes(normalized(out), out):
            warnings.simplefilter("always", QualityLossWarning)
            warnings.simplefilter("always", RandomInputsWarning)
            warnings.simplefilter("always", LeftOutGraphsWarning)
            path = export_model(source, out, opset=opset, tol=tol, force=force, progress=True,
                                on_loaded=lambda: click.echo(f"exporting {checkpoint or adapter} (opset {opset}); "
                                                             "checking parity over the shape matrix ...", err=True),
                                on_parity=lambda rows: click.echo(format_table(rows, tol)),
                                quantize=quantize, dtype=dtype, quality_tol=quality_tol,
                                accept_quality_loss=accept_quality_loss,
                                on_quality=lambda rows: click.echo(format_quality(rows, quality_tol, mode)))
    except UsageError as exc:  # options that contradict the model (a tolerance of the other kind)
        raise click.UsageError(str(exc)) from None
    except input_errors() as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a full disk, a file system that takes no new files: the staging copy is gone already
        if no_temporary_directory(exc) or isinstance(exc, StdoutError):  # not --out's fault: cli.main says it
            raise
        raise click.ClickException(f"--out {out}: the export could not be written ({exc.strerror or exc}); nothing "
                                   "was written there") from None
    for warning in caught:
        if issubclass(warning.category, (RandomInputsWarning, LeftOutGraphsWarning)):
            click.echo(f"note: {warning.message}", err=True)
        elif issubclass(warning.category, QualityLossWarning):
            click.echo(f"warning: {warning.message}", err=True)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    wrote(path, "" if mode == "fp32" else f" ({mode}, quality report in its manifest)", err=False, last=True)


def checkpoint_spec(checkpoint: Path) -> Any:
    """CHECKPOINT's ModelSpec from its spec.json, or None where it cannot be read (the export's own checks name why)."""
    from runtime.spec import ModelSpec
    from training.checkpoint import read_meta

    try:
        return ModelSpec.from_dict(read_meta(checkpoint)["spec"])
    except Exception:  # noqa: BLE001  (any unreadable spec)
        return None



def check_verify_data(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--data names point data ('squares', PATH.npz) or text data (a built-in, PATH.tsv, SRC,TGT); which one fits
    is checked once the model's kind is known. A named file that does not exist is a usage error."""
    from .train_tokens import check_text_data

    if value is None or value == "squares":
        return value
    if value.lower().endswith(".npz"):
        return check_data_option(ctx, param, value)
    return check_text_data(value)


@click.command("verify", short_help="Compare a checkpoint (or your own model) and its export.")
@click.argument("paths", nargs=-1, required=True, metavar="[CHECKPOINT] MODEL_DIR", type=click.Path(path_type=Path))
@click.option("--adapter", metavar="MODULE:FUNCTION", default=None,
              help="Your own model, exported with export --adapter: compare it (PyTorch) with MODEL_DIR.")
@tolerance_options
@click.option("--data", "data", default=None, callback=check_verify_data,
              help="Compare on this data instead of the checkpoint's own: 'squares' or PATH.npz for point models; "
                   "reverse, toy-translation, lookup, dates, PATH.tsv or SRC,TGT for token models (default: the "
                   "checkpoint's training data, when it can still be found).")
@user_errors
def verify_command(paths: tuple[Path, ...], adapter: str | None, atol: float, rtol: float, drift_atol: float,
                   data: str | None) -> None:
    """Compare PyTorch (CHECKPOINT, or --adapter MODULE:FUNCTION) and onnxruntime (MODEL_DIR) across batches and
    lengths."""
    if len(paths) != (1 if adapter else 2):
        want = "MODEL_DIR alone with --adapter" if adapter else "CHECKPOINT MODEL_DIR (or --adapter and MODEL_DIR)"
        if not adapter and len(paths) == 1 and declared_export(paths[0]):
            want = f"--adapter MODULE:FUNCTION: {paths[0]} holds a declared model, whose PyTorch side is your own code"
        raise click.UsageError(f"expected {want}, got {len(paths)} path(s): {' '.join(map(str, paths))}")
    for name, path in zip(("MODEL_DIR",) if adapter else ("CHECKPOINT", "MODEL_DIR"), paths):
        if not path.is_dir():  # checked here, not by click, so that the message names which of the two it is
            raise click.BadParameter(f"directory {str(path)!r} does not exist" if not path.exists() else
                                     f"{str(path)!r} is a file, not a directory", param_hint=name)
    require_torch()
    from export.parity import Tolerance
    from export.verify import input_errors, verify

    model_dir = paths[-1]
    try:
        source = paths[0] if adapter is None else load_adapter(adapter)
        passed = verify(source, model_dir, Tolerance(atol, rtol, drift_atol), data, show=click.echo,
                        note=lambda line: click.echo(line, err=True))
    except UsageError:
        raise
    except input_errors() as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(passed)
