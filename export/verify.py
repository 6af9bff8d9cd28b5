"""Compare a checkpoint with its export: PyTorch against onnxruntime, or a reduced-precision export against a fresh
float32 one (what `seq2onnx verify` runs). Results go to `show`, notes to `note`; a failure is a typed error."""
from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.errors import Seq2OnnxError, UsageError
from runtime.model import Seq2Seq
from runtime.spec import SpecError
from training.checkpoint import (
    CheckpointError,
    load_checkpoint_vocabularies,
    read_data_description,
)
from training.data import DataError, load_dataset, reload_dataset
from training.text_data import load_text_dataset, reload_text_dataset

from .api import checkpoint_data, export_model, load_source
from .parity import Row, Tolerance, data_cases, format_table, matrix_cases, run_parity
from .quality import QualityTolerance, failures, format_quality, quality_report
from .token_parity import fitting_texts, run_token_data_parity, run_token_parity

Say = Callable[[str], None]


class VerifyError(Seq2OnnxError, ValueError):
    """The checkpoint and the export are not a pair, or they differ beyond the tolerances."""


def input_errors() -> tuple[type[Exception], ...]:
    """Errors that describe a user's input (a bad checkpoint, export or spec), shown without a traceback."""
    return Seq2OnnxError, CheckpointError, SpecError


def is_point_data(data: str) -> bool:
    """--data names point data ('squares', PATH.npz) rather than text data."""
    return data == "squares" or data.endswith(".npz")


def check_pair(checkpoint: Path, model_dir: Path, spec: Any, runtime: Any) -> None:
    """The export must come from a model of the checkpoint's spec, and (tokens) with its vocabularies."""
    if runtime.spec != spec:
        mine, theirs = dataclasses.asdict(spec), dataclasses.asdict(runtime.spec)  # defaults shown, not None
        fields = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        shown = ", ".join(f"{k}: {mine.get(k)!r} vs {theirs.get(k)!r}" for k in fields)
        raise VerifyError(f"{checkpoint} and {model_dir} hold different models ({shown}); they cannot be compared")
    if spec.kind == "tokens":
        mine = dict(zip(("source", "target"), load_checkpoint_vocabularies(checkpoint)))
        differ = [side for side, vocab in runtime.vocabularies.items() if mine[side].sha256 != vocab.sha256]
        if differ:
            raise VerifyError(f"the {' and '.join(differ)} vocabulary of {checkpoint} differs from {model_dir}'s; "
                              "the same ids would read as other text, so the two are not a pair")


def verify(checkpoint: Path, model_dir: Path, tol: Tolerance, data: str | None, show: Say, note: Say) -> str:
    """Compare CHECKPOINT (PyTorch) with MODEL_DIR (onnxruntime); the line saying all passed, else VerifyError."""
    model, spec, _ = load_source(checkpoint)
    runtime = Seq2Seq.load(model_dir, provider="cpu")
    check_pair(checkpoint, model_dir, spec, runtime)
    precision = runtime.manifest.raw.get("precision")
    if isinstance(precision, dict) and precision.get("weights", "fp32") != "fp32":
        return verify_reduced(checkpoint, model_dir, runtime, tol, data, show, note)
    if spec.kind == "tokens":
        rows = token_rows(checkpoint, data, model, runtime, tol, note)
    else:
        rows = run_parity(model, runtime, matrix_cases(spec.n_features) + dataset_cases(checkpoint, data, spec, note),
                          tol, progress=True)
    show(format_table(rows, tol))
    failed = [r for r in rows if not r.ok]
    if failed:
        source = runtime.manifest.raw.get("source")
        raise VerifyError(f"{len(failed)} of {len(rows)} checks exceed {tol}; {model_dir} says it was exported "
                          f"from {source!r}: if that is not {checkpoint}, the two are not a pair")
    return f"all {len(rows)} checks within {tol}"


def recorded_quality(model_dir: Path, runtime: Any) -> tuple[QualityTolerance, dict[str, Any]]:
    """The quality tolerances a reduced-precision export's manifest records, and that record."""
    recorded = runtime.manifest.raw.get("quality")
    recorded = recorded if isinstance(recorded, dict) else {}
    names = [f.name for f in dataclasses.fields(QualityTolerance)]
    try:
        return QualityTolerance(**{name: recorded[name] for name in names if name in recorded}), recorded
    except (TypeError, ValueError) as exc:
        raise VerifyError(f"{model_dir}: the manifest's quality tolerances are unreadable ({exc}); re-export the "
                          "model") from None


def verify_reduced(checkpoint: Path, model_dir: Path, runtime: Any, tol: Tolerance, data: str | None, show: Say,
                   note: Say) -> str:
    """An int8/fp16 export: export CHECKPOINT at float32 into a temporary directory (parity against PyTorch at
    --atol/--rtol/--drift-atol), then compare MODEL_DIR with it at the quality tolerances its manifest records."""
    if data is not None and is_point_data(data) != (runtime.spec.kind == "points"):
        raise UsageError(f"{data!r} does not fit {checkpoint}, a {runtime.spec.kind} model", param="--data")
    qtol, recorded = recorded_quality(model_dir, runtime)
    mode = runtime.manifest.raw["precision"]["weights"]
    note(f"{model_dir} is an {mode} export: checking a float32 export of {checkpoint} against PyTorch, then "
         f"{model_dir} against that float32 export ({qtol})")
    with tempfile.TemporaryDirectory() as tmp:
        reference = Seq2Seq.load(export_model(checkpoint, Path(tmp) / "fp32", tol=tol, progress=True,
                                              on_parity=lambda rows: show(format_table(rows, tol))),
                                 provider="cpu")
        candidate = Seq2Seq.load(model_dir, provider="auto")  # a GPU measures fp16 where it is meant to run
        rows = quality_report(reference, candidate, qtol, checkpoint_data(checkpoint, runtime.spec, data))
    note(f"{model_dir} ran on {candidate.providers[0]}")
    show(format_quality(rows, qtol, mode))
    failed = failures(rows)
    if failed:
        accepted = " (it was published with --accept-quality-loss)" if recorded.get("accepted_beyond_tolerance") else ""
        raise VerifyError(f"{len(failed)} checks exceed the quality tolerances of {model_dir}{accepted}")
    return f"float32 parity and all {mode} quality checks within tolerance"


def token_rows(checkpoint: Path, data: str | None, model: Any, runtime: Any, tol: Tolerance, note: Say) -> list[Row]:
    """Token models: the random-id matrix, then real texts (--data, else the checkpoint's own data if found):
    step log-probs within tolerance (transformers: also the cached step against the full-sequence decoder at every
    position), greedy and beam ids identical, over batch sizes and padded lengths."""
    if data is not None and is_point_data(data):  # a usage error, before any work
        raise UsageError(f"{data!r} is point data; {checkpoint} is a token model: pass a text data set",
                         param="--data")
    rows = run_token_parity(model, runtime, tol)
    try:
        train, test = load_text_dataset(data) if data is not None else reload_text_dataset(
            read_data_description(checkpoint) or {})
    except DataError as exc:
        if data is not None:
            raise VerifyError(f"--data: {exc}") from None
        note(f"note: the checkpoint's training data cannot be reloaded ({exc}); comparing on random ids only "
             "(pass --data to compare on real texts)")
        return rows
    for name, pairs in (("test", test), ("train", train)):
        left_out = len(pairs.sources) - len(fitting_texts(list(pairs.sources), runtime))
        if left_out:
            note(f"note: {left_out} {name} text(s) are longer than the transformer's max_positions "
                 f"{runtime.spec.max_positions} (</s> included), which the runtime refuses; comparing on the others")
        rows += run_token_data_parity(model, runtime, list(pairs.sources), name, tol)
    return rows


def dataset_cases(checkpoint: Path, data: str | None, spec: Any, note: Say) -> list:
    """Parity cases from real data: --data (read, or the command fails), else the checkpoint's own data if found."""
    if data is not None:
        if not is_point_data(data):
            raise UsageError(f"{data!r} is text data; {checkpoint} is a point model: pass 'squares' or PATH.npz",
                             param="--data")
        try:
            train, test = load_dataset(data)
        except DataError as exc:
            raise VerifyError(f"--data: {exc}") from None
        if train.n_features != spec.n_features:
            raise VerifyError(f"--data: {data} has {train.n_features} features per point, the model expects "
                              f"{spec.n_features}; pass data the checkpoint was trained on")
    else:
        description = read_data_description(checkpoint)
        if description is None:
            return []
        try:
            train, test = reload_dataset(description)
        except (DataError, OSError):  # moved or edited since training: say so, compare on random inputs
            named = description.get("path", description.get("name"))
            note(f"note: the checkpoint's training data {named!r} is missing or changed since training; comparing "
                 "on random inputs only (pass --data to compare on real data)")
            return []
    return data_cases("train", train.source, spec.target_len) + data_cases("test", test.source, spec.target_len)
