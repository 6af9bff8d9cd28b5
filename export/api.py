"""`export_model`: checkpoint or model object -> encoder.onnx, decoder_step.onnx, manifest.json."""
from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any, Callable

from runtime.contract import VOCAB_FILES
from runtime.model import Seq2Seq
from runtime.vocab import Vocabulary
from runtime.spec import ModelSpec
from training.atomic import staged_directory
from training.build import spec_from_model
from training.destination import normalized
from training.models import EncoderDecoder
from training.token_base import TokenModel

from .atomic import check_destination
from .errors import ExportError
from .token_parity import run_token_parity
from .graphs import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, export_graphs
from .manifest import build_manifest, write_manifest
from .parity import Row, Tolerance, matrix_cases, raise_on_failure, report, run_parity


def load_source(source: str | Path | EncoderDecoder | TokenModel) -> tuple[Any, ModelSpec, str]:
    """A checkpoint directory or a model object -> (private copy of the model, spec, description)."""
    if isinstance(source, TokenModel):
        return copy.deepcopy(source).eval(), source.spec, f"in-memory {type(source).__name__}"
    if isinstance(source, EncoderDecoder):
        return copy.deepcopy(source).eval(), spec_from_model(source), f"in-memory {type(source).__name__}"
    from training.checkpoint import load_checkpoint

    model, spec, _ = load_checkpoint(Path(source))
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


def source_vocabularies(source: str | Path | EncoderDecoder | TokenModel, spec: ModelSpec,
                        given: tuple[Vocabulary, Vocabulary] | None) -> tuple[Vocabulary, Vocabulary] | None:
    """The vocabularies to ship: a token checkpoint's own (a `given` pair must then be the same, by sha256), else
    `given`, checked against the spec."""
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


def export_model(
    source: str | Path | EncoderDecoder | TokenModel, out: str | Path, *, opset: int = DEFAULT_OPSET,
    tol: Tolerance = Tolerance(), force: bool = False, progress: bool = False,
    on_parity: Callable[[list[Row]], None] | None = None,
    vocabularies: tuple[Vocabulary, Vocabulary] | None = None,
) -> Path:
    """Export, check parity over the shape matrix, and only then move the result into `out`.

    Token models ship their (source, target) vocabularies, hashed beside the graphs: a checkpoint's own (an explicit
    `vocabularies` must equal them), or, for a model object, the `vocabularies` given."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset: expected {MIN_OPSET}..{MAX_OPSET}, got {opset}")
    out = normalized(out)
    check_destination(out, force)  # before any work; checked again just before publishing
    model, spec, described = load_source(source)
    vocabularies = source_vocabularies(source, spec, vocabularies)
    export_id = uuid.uuid4().hex
    with staged_directory(out, lambda existing: check_destination(existing, force)) as staging:
        export_graphs(model, spec, staging, opset, export_id)
        for side, vocab in zip(VOCAB_FILES, vocabularies or ()):
            vocab.save(staging / VOCAB_FILES[side])
        manifest = build_manifest(staging, spec, export_id, opset, None, described)
        write_manifest(staging, manifest)  # the runtime loads the staged copy for the parity run
        runtime = Seq2Seq.load(staging, provider="cpu")
        rows = (run_token_parity(model, runtime, tol) if spec.kind == "tokens"
                else run_parity(model, runtime, matrix_cases(spec.n_features), tol, progress=progress))
        if on_parity is not None:
            on_parity(rows)
        raise_on_failure(rows, tol)
        write_manifest(staging, {**manifest, "parity": report(rows, tol)})
    return out
