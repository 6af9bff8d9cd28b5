"""Compare a checkpoint with its export: PyTorch against onnxruntime, or a reduced-precision export against a fresh
float32 one (what `seq2onnx verify` runs). Results go to `show`, notes to `note`; a failure is a typed error."""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from runtime.errors import Seq2OnnxError, UsageError
from runtime.model import Seq2Seq
from runtime.spec import SpecError
from training.checkpoint import CheckpointError, load_checkpoint_vocabularies
from training.points.data import is_point_data

from .adapted import Adapted
from .api import export_model, load_source
from .errors import VerifyError
from .kinds import KINDS
from .parity import ROUNDING, Say, Tolerance, format_table
from .quality import quality_report
from .quality_inputs import checkpoint_data, random_only
from .quality_rows import (
    DATA_CASES,
    QualityTolerance,
    failures,
    format_quality,
    judged_then,
    new_measures,
    on_data,
    worse_than_accepted,
)

__all__ = ["VerifyError", "check_pair", "input_errors", "verify"]


def input_errors() -> tuple[type[Exception], ...]:
    """Errors that describe a user's input (a bad checkpoint, export or spec), shown without a traceback."""
    return Seq2OnnxError, CheckpointError, SpecError


def check_pair(checkpoint: Any, model_dir: Path, spec: Any, runtime: Any, model: Any = None) -> None:
    """The export must come from a model of the checkpoint's spec, and (tokens) with its vocabularies; a declared
    model's export, from a model of the same contract and vocabularies."""
    if isinstance(model, Adapted):
        adapter = model.adapter
        if not runtime.spec.is_declared:
            raise VerifyError(f"{model_dir} holds one of seq2onnx's own {runtime.spec.kind} models, not a declared "
                              f"one; compare it with its checkpoint: seq2onnx verify CHECKPOINT {model_dir}")
        mine = {"source": adapter.source_vocab, "target": adapter.target_vocab}
        differ = [f"the {side} vocabulary differs ({len(mine[side])} tokens, the export's {len(vocab)})"
                  for side, vocab in runtime.vocabularies.items() if mine[side].sha256 != vocab.sha256]
        if runtime.spec != spec or runtime.contract != model.contract or differ:
            what = "; ".join(differ) or "the contracts (state, its shapes, special ids) differ"
            raise VerifyError(f"adapter {adapter.name!r} and {model_dir} are not a pair: {what}; they cannot be "
                              "compared")
        return
    if runtime.spec != spec:
        mine, theirs = dataclasses.asdict(spec), dataclasses.asdict(runtime.spec)  # defaults shown, not None
        fields = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        kinds = [k for k in ("kind", "arch") if k in fields]  # other kinds' fields only differ by their defaults
        fields = kinds or fields
        shown = ", ".join(f"{k}: {mine.get(k)!r} vs {theirs.get(k)!r}" for k in fields)
        raise VerifyError(f"{checkpoint} and {model_dir} hold different models ({shown}); they cannot be compared")
    if spec.kind == "tokens":
        mine = dict(zip(("source", "target"), load_checkpoint_vocabularies(checkpoint)))
        differ = [side for side, vocab in runtime.vocabularies.items() if mine[side].sha256 != vocab.sha256]
        if differ:
            raise VerifyError(f"the {' and '.join(differ)} vocabulary of {checkpoint} differs from {model_dir}'s; "
                              "the same ids would read as other text, so the two are not a pair")


def verify(checkpoint: Any, model_dir: Path, tol: Tolerance, data: str | None, show: Say, note: Say) -> str:
    """Compare CHECKPOINT (or a Seq2SeqAdapter: a declared model) in PyTorch with MODEL_DIR in onnxruntime; the
    line saying all passed, else VerifyError."""
    model, spec, described = load_source(checkpoint)
    runtime = Seq2Seq.load(model_dir, provider="cpu")
    check_pair(checkpoint, model_dir, spec, runtime, model)
    name = described if isinstance(model, Adapted) else checkpoint
    precision = runtime.manifest.raw.get("precision")
    if isinstance(precision, dict) and precision.get("weights", "fp32") != "fp32":
        return verify_reduced(checkpoint, model_dir, runtime, tol, data, show, note, name)
    rows = KINDS[spec.kind].verify_rows(checkpoint, data, model, runtime, tol, note)
    show(format_table(rows, tol))
    failed = [r for r in rows if not r.ok]
    if failed:
        source = runtime.manifest.raw.get("source")
        worst = max(r.max_abs for r in failed)
        # this checkpoint by name, and differences of rounding size, element by element: small, or within the
        # tolerances the export itself was checked at (a few float32 steps of the never-output ids' log-probs, ~-1e4)
        rounding = worst <= ROUNDING or all(r.rounding for r in failed)
        sized = f"within {ROUNDING:g} or the tolerances an export is checked at ({Tolerance().judging(rows)})"
        if source == described and rounding:
            steps = "" if worst <= ROUNDING else f", each {sized}"
            raise VerifyError(f"{len(failed)} of {len(rows)} checks exceed {tol.judging(rows)}; {model_dir} was "
                              f"exported from {source!r}, which {name} is by name, and the largest difference is "
                              f"{worst:.3g}{steps}: float32 rounding, where the tolerance is tighter than an export "
                              "can hold")
        raise VerifyError(f"{len(failed)} of {len(rows)} checks exceed {tol.judging(rows)} (the largest difference "
                          f"{worst:.3g}); {pair_hint(model_dir, source, name)}"
                          + (f"; but every difference is float32-sized ({sized}): if {name} is a copy or a move "
                             "of it, the tolerance is the suspect" if rounding else ""))
    return f"all {len(rows)} checks within {tol.judging(rows)}"


def pair_hint(model_dir: Path, source: Any, name: Any) -> str:
    """What to suspect when an export and a checkpoint disagree: that they are not a pair (a checkpoint retrained
    into the same directory keeps its name)."""
    return (f"{model_dir} says it was exported from {source!r}: if that is not {name}, or {name} was trained again "
            "since, the two are not a pair")


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


def verify_reduced(checkpoint: Any, model_dir: Path, runtime: Any, tol: Tolerance, data: str | None, show: Say,
                   note: Say, name: Any = None) -> str:
    """An int8/fp16 export: export CHECKPOINT at float32 into a temporary directory (parity against PyTorch at
    --atol/--rtol/--drift-atol), then compare MODEL_DIR with it at the quality tolerances its manifest records, on
    what it was judged on when it was published (the checkpoint's data, else seeded random inputs), against the
    record: the pair's verdict. `data` (--data) is measured besides, and said: what the precision loses on data it
    was not judged on tells how it does there, not whether the two are a pair."""
    if data is not None and is_point_data(data) != (runtime.spec.kind == "points"):
        raise UsageError(f"{data!r} does not fit {name or checkpoint}, a {runtime.spec.kind} model", param="--data")
    qtol, recorded = recorded_quality(model_dir, runtime)
    mode = runtime.manifest.raw["precision"]["weights"]
    note(f"{model_dir} is an {mode} export: checking a float32 export of {name or checkpoint} against PyTorch, then "
         f"{model_dir} against that float32 export ({qtol})")
    with tempfile.TemporaryDirectory() as tmp:
        reference = Seq2Seq.load(export_model(checkpoint, Path(tmp) / "fp32", tol=tol, progress=True,
                                              on_parity=lambda rows: show(format_table(rows, tol))),
                                 provider="cpu")
        candidate = Seq2Seq.load(model_dir, provider="auto")  # a GPU measures fp16 where it is meant to run
        inputs = checkpoint_data(checkpoint, runtime.spec)
        rows = quality_report(reference, candidate, qtol, inputs)
        given = [] if data is None else [dataclasses.replace(r, case=f"--data {r.case}") for r in quality_report(
            reference, candidate, qtol, checkpoint_data(checkpoint, runtime.spec, data)) if on_data(r)]
    why_random = random_only(checkpoint, inputs)
    if why_random:
        note(f"note: {why_random}" + (" (or pass --data)" if data is None else ""))
    note(f"{model_dir} ran on {candidate.providers[0]}")
    show(format_quality(rows, qtol, mode))
    if given:
        show(format_quality(given, qtol, mode))
    failed = failures(rows)
    new = new_measures(failed, recorded) + failures(given)  # on data it was not judged on: not compared with the record
    worse = worse_than_accepted([r for r in failed if r not in new], recorded)
    if worse:
        hint = pair_hint(model_dir, runtime.manifest.raw.get("source"), name or checkpoint)
        if recorded.get("accepted_beyond_tolerance") is not True:
            counted = "1 check exceeds" if len(worse) == 1 else f"{len(worse)} checks exceed"
            raise VerifyError(f"{counted} the quality tolerances of {model_dir}; {hint}")
        named = ", ".join(f"{r.case} {r.metric}" for r in worse[:3]) + (", ..." if len(worse) > 3 else "")
        raise VerifyError(f"{model_dir} was published with --accept-quality-loss, and {len(worse)} of its checks "
                          f"beyond the quality tolerances went beyond the loss it accepted then ({named}); {hint}")
    if new:
        return _new_data_verdict(new, [r for r in rows if r not in new], recorded, model_dir, mode,
                                 data if given else None)
    if failed:
        return (f"float32 parity; {len(failed)} {mode} quality check{'' if len(failed) == 1 else 's'} beyond "
                "tolerance, as recorded when it was published with --accept-quality-loss, and no worse")
    return f"float32 parity and all {mode} quality checks within tolerance"


def _new_data_verdict(new: list[Any], rows: list[Any], recorded: dict[str, Any], model_dir: Path, mode: str,
                      data: str | None) -> str:
    """verify's verdict where the only checks beyond tolerance are on data the export was not judged on when it
    was published (`new_measures`): they say how the precision does there, not that the pair is wrong. Passed, with
    the count, for an export published with --accept-quality-loss; else a VerifyError saying so."""
    ours = any(not r.case.startswith("--data ") for r in new)  # rows of the checkpoint's data, not --data's
    where = " and ".join(["the checkpoint's data"] * ours + [f"--data {data!r}"] * (data is not None))
    named = ", ".join(f"{r.case} {r.metric}" for r in new[:3]) + (", ..." if len(new) > 3 else "")
    counted = f"{len(new)} {mode} quality check{'' if len(new) == 1 else 's'} on {where}"
    then = judged_then(recorded)
    judged = ("its training data" if any(str(case).startswith(DATA_CASES) for case, _ in then)
              else "seeded random inputs")
    compared = sum((r.case, r.metric) in then for r in rows)
    there = (f"where {compared} checks measured again are as recorded" if compared else
             "which this run did not measure again")
    if recorded.get("accepted_beyond_tolerance") is True:
        return (f"float32 parity; {counted} beyond tolerance ({named}), on data {model_dir} was not judged on when "
                f"it was published with --accept-quality-loss (it was judged on {judged}, {there})")
    raise VerifyError(f"{counted} exceed the quality tolerances ({named}): {model_dir} was judged on {judged} when "
                      f"it was published, {there}; so this says how {mode} does on this data, not that the two "
                      "are not a pair (re-export judged on this data: export_model(..., quality_data=...))")
