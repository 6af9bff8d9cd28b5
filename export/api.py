"""`export_model`: checkpoint or model object -> encoder.onnx, decoder_step.onnx, manifest.json."""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch

from runtime.atomic import staged_directory
from runtime.contract import FAST_FILES, GREEDY_FILE, VOCAB_FILES
from runtime.defaults import DEFAULT_OPSET, DTYPES, FP16, FP32, INT8, QUANTIZATIONS
from runtime.destination import normalized
from runtime.errors import Seq2OnnxError, UsageError, brief, clipped, one_line
from runtime.model import Seq2Seq
from runtime.siblings import STAGING_SUFFIX, sibling
from runtime.spec import ModelSpec
from runtime.vocab import Vocabulary
from training.build import spec_from_model
from training.points.models import EncoderDecoder
from training.tokens.base import TokenModel

from .adapted import Adapted, probe
from .adapter import Seq2SeqAdapter
from .atomic import check_destination
from .errors import ExportError
from .graphs import MAX_OPSET, MIN_OPSET, export_fast, export_graphs, export_greedy
from .kinds import KINDS
from .manifest import build_manifest, write_manifest
from .parity import Row, Tolerance, raise_on_failure, report
from .precision import precision_entry
from .quality import quality_report
from .quality_inputs import check_quality_data, check_quality_texts, checkpoint_data, random_only
from .quality_rows import QualityError, QualityRow, QualityTolerance, failures, quality_summary
from .quantize import check_loads, convert_graphs
from .sizes import BAKED, declared_parity
from .weights import check_weights


class QualityLossWarning(UserWarning):
    """A reduced-precision export was published although it loses more than the stated tolerance."""


class RandomInputsWarning(UserWarning):
    """A checkpoint's reduced-precision export was judged on random inputs: its training data cannot be read now."""


class LeftOutGraphsWarning(UserWarning):
    """A float16 export of a transformer holds none of its fast graphs (left out of float16 exports)."""


Source = str | Path | EncoderDecoder | TokenModel | Seq2SeqAdapter


def load_source(source: Source) -> tuple[Any, ModelSpec, str]:
    """A checkpoint directory, a model object or a declared model -> (private copy of the model, or the probed
    adapter; spec; description). Anything else is an ExportError saying what is accepted."""
    if isinstance(source, Seq2SeqAdapter):
        adapted = probe(source)
        unnamed = source.name == Seq2SeqAdapter.name  # "adapter adapter" read as a stutter in verify's hint
        return adapted, adapted.spec, "adapter (unnamed)" if unnamed else f"adapter {source.name}"
    if not isinstance(source, (str, Path, EncoderDecoder, TokenModel)):
        hint = (" (a function: call it, export_model(make_adapter()))" if callable(source)
                and not isinstance(source, torch.nn.Module) else "")
        raise ExportError(f"source: expected a checkpoint directory (str or Path), a seq2onnx model (EncoderDecoder, "
                          f"TokenModel) or your own model declared as an export.adapter.Seq2SeqAdapter, got "
                          f"{brief(source)}{hint}; see the README's 'Bring your own model'")
    if isinstance(source, (TokenModel, EncoderDecoder)):
        described = f"in-memory {type(source).__name__}"
        check_weights(source, described)
        spec = source.spec if isinstance(source, TokenModel) else spec_from_model(source)
        return copy.deepcopy(source).eval(), spec, described
    from training.checkpoint import load_checkpoint

    model, spec, _ = load_checkpoint(Path(source))
    check_weights(model, f"checkpoint {Path(source).name}")
    return model.eval(), spec, f"checkpoint {Path(source).name}"


def check_vocabularies(spec: ModelSpec, vocabularies: tuple[Vocabulary, Vocabulary] | None) -> None:
    """Token models need (source, target) vocabularies whose sizes are the spec's; point models none."""
    if spec.kind != "tokens":
        if vocabularies is not None:
            raise ExportError("vocabularies: a point model has none; drop the argument")
        return
    if not (isinstance(vocabularies, tuple) and len(vocabularies) == 2
            and all(isinstance(v, Vocabulary) for v in vocabularies)):
        raise ExportError(f"vocabularies: a token model needs (source, target) Vocabulary objects, got "
                          f"{type(vocabularies).__name__}")
    sizes = (len(vocabularies[0]), len(vocabularies[1]))
    if sizes != (spec.source_vocab_size, spec.target_vocab_size):
        raise ExportError(f"vocabularies: sizes {sizes} do not match the model's (source_vocab_size, "
                          f"target_vocab_size) = {(spec.source_vocab_size, spec.target_vocab_size)}")


def source_vocabularies(source: Source, spec: ModelSpec,
                        given: tuple[Vocabulary, Vocabulary] | None) -> tuple[Vocabulary, Vocabulary] | None:
    """The vocabularies to ship: a token checkpoint's or a declared model's own (a `given` pair must then be the
    same, by sha256), else `given`, checked against the spec."""
    if isinstance(source, Seq2SeqAdapter):
        own = (source.source_vocab, source.target_vocab)
        if given is not None and [v.sha256 for v in given] != [v.sha256 for v in own]:
            raise ExportError("vocabularies: a declared model ships its adapter's source_vocab and target_vocab; "
                              "drop the argument")
        return own
    from_checkpoint = spec.kind == "tokens" and not isinstance(source, (EncoderDecoder, TokenModel))
    if given is not None or not from_checkpoint:
        check_vocabularies(spec, given)
    if not from_checkpoint:
        return given
    from training.checkpoint import load_checkpoint_vocabularies

    saved = load_checkpoint_vocabularies(Path(source))
    if given is not None and [v.sha256 for v in given] != [v.sha256 for v in saved]:
        raise ExportError(f"vocabularies: the given (source, target) differ from the ones saved in checkpoint "
                          f"{str(source)!r}; drop the argument to export the checkpoint's own")
    return saved


def precision_mode(quantize: str | None, dtype: str) -> str:
    """'fp32', 'fp16' or 'int8' from export_model's `quantize` and `dtype`; int8 is quantized from float32 graphs,
    so the two cannot be combined."""
    if quantize not in (None, *QUANTIZATIONS):
        raise UsageError(f"quantize: expected None or one of {QUANTIZATIONS}, got {quantize!r}")
    if dtype not in DTYPES:
        raise UsageError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    if quantize is not None and dtype != FP32:
        raise UsageError(f"quantize={quantize!r} with dtype={dtype!r}: int8 quantization works on float32 graphs "
                         "(onnxruntime has no int8 kernels fed float16); choose one")
    return quantize or dtype


def export_model(
    source: Source, out: str | Path, *, opset: int = DEFAULT_OPSET,
    tol: Tolerance = Tolerance(), force: bool = False, progress: bool = False,
    on_parity: Callable[[list[Row]], None] | None = None,
    vocabularies: tuple[Vocabulary, Vocabulary] | None = None,
    quantize: str | None = None, dtype: str = FP32, quality_tol: QualityTolerance = QualityTolerance(),
    accept_quality_loss: bool = False, quality_data: Any = None,
    on_quality: Callable[[list[QualityRow]], None] | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> Path:
    """Export, check parity over the shape matrix, and only then move the result into `out`.

    `source`: a checkpoint directory, a seq2onnx model object, or your own model declared as an
    `export.adapter.Seq2SeqAdapter` (probed against its declaration first; parity is then against its own PyTorch
    functions, and its own greedy decode when it gives one). Token models ship their (source, target) vocabularies,
    hashed beside the graphs: a checkpoint's or an adapter's own (an explicit `vocabularies` must equal them), or,
    for a model object, the `vocabularies` given.

    `quantize='int8'` or `dtype='fp16'`: the float32 graphs are checked for parity first, then converted, then
    compared with the float32 ones (`export.quality`) on `quality_data` (texts or (N, L, F) sources; default: a
    checkpoint's own test data) and random inputs. Beyond `quality_tol` a QualityError is raised and nothing is
    written, unless `accept_quality_loss`: then it is published with a QualityLossWarning. `on_loaded` is called
    once the source has loaded, its vocabularies are checked and `out`'s lock is held, before the graphs are made."""
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise UsageError(f"opset: expected an int in {MIN_OPSET}..{MAX_OPSET}, got {brief(opset)}")
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise UsageError(f"out: expected a str or os.PathLike naming the export directory, got {brief(out)}")
    for name, flag in (("force", force), ("progress", progress), ("accept_quality_loss", accept_quality_loss)):
        if not isinstance(flag, bool):
            raise UsageError(f"{name}: expected True or False, got {brief(flag)}")
    for name, value, kind in (("tol", tol, Tolerance), ("quality_tol", quality_tol, QualityTolerance)):
        if not isinstance(value, kind):
            raise UsageError(f"{name}: expected an {kind.__module__}.{kind.__name__}, got {brief(value)}")
    mode = precision_mode(quantize, dtype)
    if mode == FP32 and (quality_tol != QualityTolerance() or accept_quality_loss or quality_data is not None):
        given = ("quality_tol" if quality_tol != QualityTolerance() else
                 "accept_quality_loss" if accept_quality_loss else "quality_data")
        raise UsageError(f"{given} applies only to a reduced-precision export (its loss against its float32 "
                         f"graphs); pass quantize='int8' or dtype='fp16', or drop {given}")
    out = normalized(out)
    check_destination(out, force)  # before any work; checked again just before publishing
    with restored_modes(source):
        return _export(source, out, opset, tol, force, progress, on_parity, vocabularies, mode, quality_tol,
                       accept_quality_loss, quality_data, on_quality, on_loaded)


def _export(source: Source, out: Path, opset: int, tol: Tolerance, force: bool, progress: bool,
            on_parity: Callable[[list[Row]], None] | None, vocabularies: tuple[Vocabulary, Vocabulary] | None,
            mode: str, quality_tol: QualityTolerance, accept_quality_loss: bool, quality_data: Any,
            on_quality: Callable[[list[QualityRow]], None] | None,
            on_loaded: Callable[[], None] | None = None) -> Path:
    model, spec, described = load_source(source)
    if mode != FP32:
        quality_tol.check_kind(spec.kind)  # before any graph is written
        quality_data = check_quality_data(quality_data, spec)
    vocabularies = source_vocabularies(source, spec, vocabularies)
    contract = model.contract if isinstance(model, Adapted) else None
    if mode != FP32 and spec.kind == "tokens" and quality_data is not None and vocabularies is not None:
        check_quality_texts(quality_data, vocabularies[0], spec, contract)
    export_id = uuid.uuid4().hex
    with staged_directory(out, lambda existing: check_destination(existing, force)) as staging:
        if on_loaded is not None:  # once --out's lock is ours: a busy --out is said before "checking parity"
            on_loaded()
        traced(lambda: export_graphs(model, spec, staging, opset, export_id), model, described)
        for side, vocab in zip(VOCAB_FILES, vocabularies or ()):
            vocab.save(staging / VOCAB_FILES[side])
        manifest = build_manifest(staging, spec, export_id, opset, None, described, contract)
        write_manifest(staging, manifest)  # the runtime loads the staged copy for the parity run
        runtime = Seq2Seq.load(staging, provider="cpu")
        rows = declared_parity(model, lambda: KINDS[spec.kind].parity(model, runtime, tol, progress))
        if on_parity is not None:
            on_parity(rows)
        raise_on_failure(rows, tol, BAKED if isinstance(model, Adapted) else "")
        manifest = {**manifest, "parity": report(rows, tol)}
        write_manifest(staging, manifest)
        if mode != FP32:
            data = quality_data if quality_data is not None else checkpoint_data(source, spec)
            reduce_precision(staging, out, model, spec, manifest, mode, quality_tol, accept_quality_loss, data,
                             on_quality, random_only(source, data))
    return out


def traced(export: Callable[[], None], model: Any, described: str) -> None:
    """Run `export`; torch's own failure to run a seq2onnx model object (parts whose sizes do not fit together,
    say) is an ExportError naming the model. A declared model's failures are its probe's (export.adapted)."""
    try:
        export()
    except Seq2OnnxError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        if isinstance(model, Adapted):
            raise
        raise ExportError(f"{described}: could not be traced for ONNX ({clipped(one_line(exc), 300)}); check that "
                          "its parts fit together (the encoder's and decoder's sizes) and that its forward pass "
                          "runs") from exc


@contextlib.contextmanager
def restored_modes(source: Any) -> Iterator[None]:
    """A declared model's modules go to eval mode for the export (dropout off) and back to their own mode after:
    its modules are the user's own objects, not a private copy."""
    modules = [m for root in source.modules for m in root.modules()] if isinstance(source, Seq2SeqAdapter) else []
    modes = [m.training for m in modules]
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.training = mode


def reduce_precision(staging: Path, out: Path, model: Any, spec: ModelSpec, manifest: dict[str, Any], mode: str,
                     tol: QualityTolerance, accept: bool, data: Any,
                     on_quality: Callable[[list[QualityRow]], None] | None, why_random: str | None = None) -> None:
    """Convert the checked float32 graphs in `staging` to `mode`, compare them with a float32 copy (beside `out`,
    removed after), and record precision and quality in the manifest; raise QualityError beyond `tol`."""
    contract = model.contract if isinstance(model, Adapted) else None
    reference_dir = sibling(out, STAGING_SUFFIX)  # a killed export's copy is tidied like its staging directory
    try:  # the copy is made inside the try: a stop that lands while it is made removes what it had copied
        shutil.copytree(staging, reference_dir)
        fast = [name for name in FAST_FILES.values() if (staging / name).exists()]
        for name in fast:  # float32: rebuilt from the weights for int8, left out for float16
            (staging / name).unlink()
        if mode == INT8 and spec.kind == "tokens" and spec.is_transformer:
            export_fast(model, spec, staging, manifest["export_id"], int8=True)
        convert_graphs(staging, spec, mode)
        if (staging / GREEDY_FILE).exists():  # the greedy loop wraps the step: rebuilt around the converted one
            export_greedy(staging, spec, manifest["export_id"], contract)
        converted = {**build_manifest(staging, spec, manifest["export_id"], manifest["opset"], manifest["parity"],
                                      manifest["source"], contract),
                     "precision": precision_entry(staging, spec, mode)}
        write_manifest(staging, converted)
        check_loads(staging, mode)
        rows = quality_report(Seq2Seq.load(reference_dir, provider="cpu"), Seq2Seq.load(staging, provider="cpu"),
                              tol, data)
    finally:
        shutil.rmtree(reference_dir, ignore_errors=True)
    if on_quality is not None:
        on_quality(rows)
    failed = failures(rows)
    if failed and not accept:
        shown = "\n".join(f"  {r.case}: {r.metric} {r.value:.4g}, limit {r.limit:g}" for r in failed)
        raise QualityError(f"the {mode} export loses more than the tolerance ({tol.judged(spec.kind)}) against its "
                           f"float32 graphs in {len(failed)} of {sum(r.limit is not None for r in rows)} checks; "
                           "nothing was written. Publish it anyway with --accept-quality-loss (export_model's "
                           "accept_quality_loss=True), or loosen the tolerance ("
                           f"{', '.join('--' + n.replace('_', '-') for n in tol.names(spec.kind))}; export_model's "
                           f"quality_tol):\n{shown}" + (f"\nNote: {why_random}" if why_random else ""))
    if why_random:
        warnings.warn(f"{out}: {why_random}", RandomInputsWarning, stacklevel=3)
    if fast and mode == FP16:  # said: the files' parity rows were printed, and the decode is slower without them
        warnings.warn(f"{out}: float16 exports hold none of a transformer's fast graphs (fast_*, wide_*, fold_*; "
                      "their parity rows above are of the float32 graphs), so it decodes with its traced graphs, "
                      "slower on a CPU than its float32 or int8 export", LeftOutGraphsWarning, stacklevel=3)
    if failed:
        checks = f"{len(failed)} check{'' if len(failed) == 1 else 's'}"
        warnings.warn(f"{out}: the {mode} export loses more than the tolerance ({tol.judged(spec.kind)}) in {checks}; "
                      "published because the loss was accepted (the manifest's quality report says so)",
                      QualityLossWarning, stacklevel=3)
    write_manifest(staging, {**converted, "quality": {**quality_summary(rows, tol, bool(failed), spec.kind),
                                                      "measured_on": "CPUExecutionProvider"}})
