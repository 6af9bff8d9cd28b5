"""`export_model`: checkpoint or model object -> encoder.onnx, decoder_step.onnx, manifest.json."""
from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Callable

from runtime.model import Seq2Seq
from runtime.spec import ModelSpec
from training.atomic import staged_directory
from training.build import spec_from_model
from training.destination import normalized
from training.models import EncoderDecoder

from .atomic import check_destination
from .graphs import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, export_graphs
from .manifest import build_manifest, write_manifest
from .parity import Row, Tolerance, matrix_cases, raise_on_failure, report, run_parity


def load_source(source: str | Path | EncoderDecoder) -> tuple[EncoderDecoder, ModelSpec, str]:
    """A checkpoint directory or a book-style model -> (private copy of the model, spec, description)."""
    if isinstance(source, EncoderDecoder):
        return copy.deepcopy(source).eval(), spec_from_model(source), f"in-memory {type(source).__name__}"
    from training.checkpoint import load_checkpoint

    model, spec, _ = load_checkpoint(Path(source))
    return model.eval(), spec, f"checkpoint {Path(source).name}"


def export_model(
    source: str | Path | EncoderDecoder, out: str | Path, *, opset: int = DEFAULT_OPSET,
    tol: Tolerance = Tolerance(), force: bool = False, progress: bool = False,
    on_parity: Callable[[list[Row]], None] | None = None,
) -> Path:
    """Export, check parity over the shape matrix, and only then move the result into `out`."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset: expected {MIN_OPSET}..{MAX_OPSET}, got {opset}")
    out = normalized(out)
    check_destination(out, force)  # before any work; checked again just before publishing
    model, spec, described = load_source(source)
    export_id = uuid.uuid4().hex
    with staged_directory(out, lambda existing: check_destination(existing, force)) as staging:
        export_graphs(model, spec, staging, opset, export_id)
        manifest = build_manifest(staging, spec, export_id, opset, None, described)
        write_manifest(staging, manifest)  # the runtime loads the staged copy for the parity run
        runtime = Seq2Seq.load(staging, provider="cpu")
        rows = run_parity(model, runtime, matrix_cases(spec.n_features), tol, progress=progress)
        if on_parity is not None:
            on_parity(rows)
        raise_on_failure(rows, tol)
        write_manifest(staging, {**manifest, "parity": report(rows, tol)})
    return out
