"""The rows of a quality report (export.quality) and how they are judged, summarised and printed: a
reduced-precision export's tolerances, one row per measure, the manifest's record and the table `export` and
`verify` print."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from runtime.defaults import (
    MAX_ATTENTION_DIFF,
    MAX_OUTPUT_DIFF,
    MIN_EXACT_MATCH,
    MIN_TOKEN_AGREEMENT,
)
from runtime.errors import UsageError, brief

from .errors import ExportError

# Column headers of the printed table.
HEADERS = {"outputs.max_abs": "out abs", "outputs.max_rel": "out rel", "outputs.diff/scale": "out/scale",
           "attention.max_abs": "attn abs", "loop.outputs.diff/scale": "loop out/scale",
           "loop.attention.max_abs": "loop attn abs", "exact_match": "exact", "token_agreement": "agreement",
           "step.log_probs.max_abs": "logp abs"}


class QualityError(ExportError):
    """A reduced-precision export loses more than the stated tolerance against its float32 graphs."""


@dataclass(frozen=True)
class QualityTolerance:
    """What a reduced-precision export may lose against float32 (see the constants above)."""

    max_output_diff: float = MAX_OUTPUT_DIFF
    max_attention_diff: float = MAX_ATTENTION_DIFF
    min_exact_match: float = MIN_EXACT_MATCH
    min_token_agreement: float = MIN_TOKEN_AGREEMENT

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and
                                                value >= 0):
                raise UsageError(f"QualityTolerance {name}: expected a finite number >= 0, got {brief(value)}", name)
        for name in ("min_exact_match", "min_token_agreement"):
            if getattr(self, name) > 1:
                raise UsageError(f"QualityTolerance {name}: expected a rate in [0, 1], got {getattr(self, name)!r}",
                                 name)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in asdict(self).items())

    @staticmethod
    def names(kind: str) -> tuple[str, str]:
        """The tolerances that judge a model of `kind` ('points': differences; 'tokens': agreement rates)."""
        return ("max_output_diff", "max_attention_diff") if kind == "points" else ("min_exact_match",
                                                                                  "min_token_agreement")

    def check_kind(self, kind: str, given: tuple[str, ...] = ()) -> None:
        """UsageError where a tolerance that judges the other kind of model was moved from its default, or is
        among `given` (a caller's explicit ones, its default value or not): it would change nothing (a token model
        is judged by agreement rates, a point model by differences)."""
        other = self.names("tokens" if kind == "points" else "points")
        moved = [n for n in other if n in given or getattr(self, n) != getattr(QualityTolerance, n)]
        if moved:
            flags = ", ".join("--" + n.replace("_", "-") for n in self.names(kind))
            shown = ", ".join(f"{n}={getattr(self, n):g} (--{n.replace('_', '-')})" for n in moved)
            raise UsageError(f"quality tolerance {shown} judges {'token' if kind == 'points' else 'point'} models; "
                             f"this is a {'point' if kind == 'points' else 'token'} model, judged by "
                             f"{', '.join(self.names(kind))} ({flags}): drop it or set those")

    def judged(self, kind: str) -> str:
        """`names(kind)` with their values."""
        return ", ".join(f"{name}={getattr(self, name):g}" for name in self.names(kind))


@dataclass(frozen=True)
class QualityRow:
    """One measure of one case or set: `limit` is None for a figure that is reported, not judged."""

    case: str
    count: int  # sequences compared
    metric: str
    value: float
    limit: float | None
    ok: bool


def limit_of(tol: QualityTolerance | None, name: str) -> float | None:
    """A tolerance's bar, or None (reported only) without one."""
    return None if tol is None else getattr(tol, name)


def make_row(case: str, count: int, metric: str, value: float, limit: float | None, at_least: bool = False) -> QualityRow:
    ok = limit is None or (value >= limit if at_least else value <= limit)
    return QualityRow(case, count, metric, float(value), limit, bool(ok and math.isfinite(value)))


def quality_summary(rows: list[QualityRow], tol: QualityTolerance, accepted: bool, kind: str) -> dict[str, Any]:
    """The manifest's quality report: the tolerances that judge a model of `kind`, verdict, whether a loss beyond
    them was accepted, every row."""
    judging = QualityTolerance.names(kind)
    return {**{name: value for name, value in asdict(tol).items() if name in judging}, "passed": all(r.ok for r in rows), "accepted_beyond_tolerance": accepted,
            "reference": "the same model's float32 graphs, run by onnxruntime on the same inputs",
            "rows": [asdict(r) for r in rows]}


def failures(rows: list[QualityRow]) -> list[QualityRow]:
    """The rows beyond tolerance."""
    return [r for r in rows if not r.ok]


RATES = ("exact_match", "token_agreement")  # measures where more is better; every other one is a difference
ACCEPTED_SLACK = 1e-3  # a loss re-measured on another machine (a GPU's fp16) may move this much, relative, and
                       # still be the loss the export accepted


def worse_than_accepted(failed: list[QualityRow], recorded: dict[str, Any]) -> list[QualityRow]:
    """The rows beyond tolerance that an export published with --accept-quality-loss did not accept: a case and
    measure its manifest does not record beyond tolerance, or one now worse than recorded. All of them where the
    export accepted nothing."""
    if recorded.get("accepted_beyond_tolerance") is not True:
        return failed
    accepted = {(r.get("case"), r.get("metric")): r.get("value") for r in recorded.get("rows", ())
                if isinstance(r, dict) and r.get("ok") is False}
    return [r for r in failed if not _no_worse(r, accepted.get((r.case, r.metric)))]


DATA_CASES = ("texts", "data ")  # a report's cases on real inputs (export.quality); the rest are seeded random ones


def on_data(row: QualityRow) -> bool:
    """Whether `row` measures real inputs, whose figures depend on the data given, not seeded random ones."""
    return row.case.startswith(DATA_CASES)


def judged_then(recorded: dict[str, Any]) -> dict[tuple[Any, Any], dict[str, Any]]:
    """The manifest's judged rows (with a limit) by (case, metric)."""
    return {(r.get("case"), r.get("metric")): r for r in recorded.get("rows", ())
            if isinstance(r, dict) and r.get("limit") is not None}


def new_measures(failed: list[QualityRow], recorded: dict[str, Any]) -> list[QualityRow]:
    """The rows of `failed` on real inputs where the manifest judged none (the checkpoint's data was missing when
    it was published, and is back): what they show is how the precision does on that data, not whether the export
    is of this checkpoint."""
    judged_data = any(isinstance(case, str) and case.startswith(DATA_CASES) for case, _ in judged_then(recorded))
    return [] if judged_data else [r for r in failed if on_data(r)]


def _no_worse(row: QualityRow, accepted: Any) -> bool:
    if not isinstance(accepted, (int, float)) or not math.isfinite(row.value):
        return False
    if row.metric in RATES:
        return row.value >= accepted - ACCEPTED_SLACK
    return row.value <= accepted * (1 + ACCEPTED_SLACK)


def format_quality(rows: list[QualityRow], tol: QualityTolerance, mode: str) -> str:
    """One line per case or set with each measure as a column ('!' marks a value beyond its limit), then limits."""
    metrics = list(dict.fromkeys(r.metric for r in rows))
    by_case: dict[str, dict[str, QualityRow]] = {}
    for row in rows:
        by_case.setdefault(row.case, {})[row.metric] = row
    widths = [max(len(HEADERS.get(m, m)), 10) + 2 for m in metrics]
    first = max([26, len(mode) + 8] + [len(case) for case in by_case])  # the case column: its longest name
    head = f"{mode + ' vs fp32':<{first}} {'n':>5}" + "".join(f"{HEADERS.get(m, m):>{w}}"
                                                              for m, w in zip(metrics, widths))
    lines = [head + "  ok", "-" * (len(head) + 4)]
    for case, cells in by_case.items():
        shown = [_cell(cells[m]) if m in cells else "" for m in metrics]
        count = next(iter(cells.values())).count
        judged = any(c.limit is not None for c in cells.values())
        ok = "NO" if not all(c.ok for c in cells.values()) else "yes" if judged else "-"  # '-': reported only
        lines.append(f"{case:<{first}} {count:>5}" + "".join(f"{s:>{w}}" for s, w in zip(shown, widths))
                     + f"  {ok}")
    limits = {r.metric: r.limit for r in rows if r.limit is not None}
    rules = [f"{HEADERS.get(m, m)} ({m}) {'>=' if m in ('exact_match', 'token_agreement') else '<='} {lim:g}"
             for m, lim in limits.items()]
    judged = sum(r.limit is not None for r in rows)
    lines += ["-" * (len(head) + 4), f"{len(failures(rows))} of {judged} judged checks beyond tolerance: "
              + ", ".join(rules) + "; values in parentheses are reported only"]
    return "\n".join(lines)


def _cell(row: QualityRow) -> str:
    """A value, '!' after it when beyond its limit, in parentheses when reported only."""
    return f"({row.value:.3g})" if row.limit is None else f"{row.value:.3g}{'' if row.ok else '!'}"
