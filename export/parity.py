"""Parity between onnxruntime and PyTorch, the part every model kind shares: the tolerances, one row per output of
one case, the pass rule, the manifest's report, the table `verify` prints, and one typed error listing every
failure. Each kind measures its own rows (`export.points.parity`, `export.tokens.parity`) in two ways:

- graphs: every graph output given identical inputs (PyTorch's own trajectory); this isolates the graphs, and
  `atol` applies (default 1e-5);
- decode: the whole free-running decode through the runtime. Float32 rounding differences are fed back and can
  grow with the model's dynamics, so `drift_atol` applies to point outputs (default 1e-3); a loop bug (state not
  fed back, wrong mask) shows up far above it. Token ids are exact.
An element passes when |onnxruntime - pytorch| <= tol + rtol * |pytorch| (numpy's allclose rule), so large values
are not held to an absolute bar that float32 cannot meet. Everything is measured first; then one typed error lists
every failure.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from runtime.defaults import DEFAULT_ATOL, DEFAULT_DRIFT_ATOL, DEFAULT_RTOL
from runtime.errors import UsageError, brief

from .errors import ParityError

Say = Callable[[str], None]  # where `verify` sends a table or a note
DECODE_PREFIX = "decode."  # a point model's free-running decode outputs, judged by drift_atol
REL_FLOOR = 1e-6  # denominators below this count as this, so exact zeros do not blow up the ratio
ROUNDING = 1e-4  # a difference this small is float32 rounding, whatever the value (so is one within the tolerances
# an export is checked at: `within_rounding`); `verify` then suspects the tolerance, not the pair


@dataclass(frozen=True)
class Row:
    """Max differences of one output of one case; `check` is 'graph' or 'decode'."""

    case: str
    batch: int
    source_len: int
    target_len: int
    check: str
    output: str
    max_abs: float
    max_rel: float
    ok: bool
    rounding: bool = False  # every difference beyond the tolerance is float32 rounding (`within_rounding`)


@dataclass(frozen=True)
class Tolerance:
    """atol for graph outputs, drift_atol for the free-running decode, rtol for both."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    drift_atol: float = DEFAULT_DRIFT_ATOL

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "drift_atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and
                                                value >= 0):
                raise UsageError(f"Tolerance {name}: expected a finite tolerance >= 0, got {brief(value)}", name)

    def __str__(self) -> str:
        return f"atol={self.atol:g} (graphs), drift_atol={self.drift_atol:g} (decode), rtol={self.rtol:g}"

    def judging(self, rows: list[Row]) -> str:
        """The tolerances `rows` were judged by: drift_atol only where a free-running decode's outputs are among
        them (point models'; a token model's ids must be equal and its log-probs are judged by atol and rtol)."""
        if any(r.output.startswith(DECODE_PREFIX) for r in rows):
            return str(self)
        return f"atol={self.atol:g}, rtol={self.rtol:g}"


def diffs(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float,
          accepted_atol: float = DEFAULT_ATOL) -> tuple[float, float, bool, bool]:
    """Max absolute and relative difference, whether every element is within atol + rtol*|expected|, and whether
    every one beyond that is float32 rounding (`within_rounding`, `accepted_atol` the default absolute tolerance of
    this kind of check): Row's last four fields."""
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), False, False
    if expected.size == 0:
        return 0.0, 0.0, True, True
    want = expected.astype(np.float64)
    err = np.abs(actual.astype(np.float64) - want)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    rounding = ok or within_rounding(actual, expected, atol, rtol, accepted_atol)
    return float(err.max()), float((err / np.maximum(np.abs(want), REL_FLOOR)).max()), ok, rounding


def within_rounding(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float,
                    accepted_atol: float = DEFAULT_ATOL) -> bool:
    """Whether every difference beyond atol + rtol * |expected| is float32 rounding: at most ROUNDING, or within the
    tolerances an export is checked at (accepted_atol + DEFAULT_RTOL * |expected|, which holds a few float32 steps of
    any value: 9.8e-4 a step at -1e4, a never-output id's log-prob; and the rounding a recurrent model's log-probs
    carry through every step, ~1e-4 at -11), element by element, so one check may hold both kinds; a difference a
    tighter tolerance finds there is not evidence against the pair. Values -inf or NaN on both sides count as equal;
    other non-finite ones fail."""
    if actual.shape != expected.shape:
        return False
    want, got = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
        fine = (got == want) | (np.isnan(got) & np.isnan(want)) | (err <= atol + rtol * np.abs(want))
        small = np.isfinite(err) & (err <= np.maximum(ROUNDING, accepted_atol + DEFAULT_RTOL * np.abs(want)))
        return bool(np.all(fine | small))


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Worst max_abs/max_rel per output over all cases."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        worst = out.setdefault(row.output, {"max_abs": 0.0, "max_rel": 0.0, "cases": 0, "failed": 0})
        worst["max_abs"] = max(worst["max_abs"], row.max_abs)
        worst["max_rel"] = max(worst["max_rel"], row.max_rel)
        worst["cases"] += 1
        worst["failed"] += not row.ok
    return out


def report(rows: list[Row], tol: Tolerance) -> dict:
    """The manifest's parity report: tolerances, per-output worst case and every row."""
    return {"atol": tol.atol, "rtol": tol.rtol, "drift_atol": tol.drift_atol, "passed": all(r.ok for r in rows),
            "summary": summary(rows), "cases": [asdict(r) for r in rows]}


def raise_on_failure(rows: list[Row], tol: Tolerance, hint: str = "") -> None:
    """One ParityError listing every failing output of every case (`hint`: what such a failure usually is)."""
    failures = [r for r in rows if not r.ok]
    if failures:
        lines = [f"  {r.case}: {r.output} " + (f"{r.max_abs:.0f} sequences differ" if r.output.endswith(".ids") else
                                               f"max_abs={r.max_abs:.3g} max_rel={r.max_rel:.3g}") for r in failures]
        if all(r.output == "reference.ids" for r in failures):  # onnxruntime agrees with PyTorch: the reference not
            raise ParityError(f"your reference decode differs from greedy search over your own step function (in "
                              f"PyTorch and onnxruntime alike) in {len(failures)} of the cases; check its eos and tie "
                              "handling, its lengths and special ids, or leave reference out:\n" + "\n".join(lines))
        raise ParityError(f"onnxruntime and PyTorch differ beyond {tol.judging(rows)} in {len(failures)} of "
                          f"{len(rows)} checks" + (f"; {hint}" if hint else "") + ":\n" + "\n".join(lines))


def format_table(rows: list[Row], tol: Tolerance) -> str:
    """One line per case (worst graph output, free-running decode), then the worst case per output."""
    head = f"{'case':<26} {'graphs max_abs':>14} {'decode max_abs':>14} {'decode max_rel':>14}  ok"
    lines = [head, "-" * len(head)]
    by_case: dict[str, list[Row]] = {}
    for row in rows:
        by_case.setdefault(row.case, []).append(row)
    for case, case_rows in by_case.items():
        graph = max((r.max_abs for r in case_rows if r.check == "graph"), default=0.0)
        decode = [r for r in case_rows if r.check == "decode"]
        ok = "yes" if all(r.ok for r in case_rows) else "NO"
        lines.append(f"{case:<26} {graph:>14.2e} {max(r.max_abs for r in decode):>14.2e} "
                     f"{max(r.max_rel for r in decode):>14.2e}  {ok}")
    lines += ["-" * len(head), f"{'output (worst case)':<26} {'max_abs':>14} {'max_rel':>14} {'atol':>14}"]
    for output, worst in summary(rows).items():
        atol = tol.drift_atol if output.startswith(DECODE_PREFIX) else tol.atol
        lines.append(f"{output:<26} {worst['max_abs']:>14.2e} {worst['max_rel']:>14.2e} {atol:>14g}"
                     + (f"  {worst['failed']} FAILED" if worst["failed"] else ""))
    lines.append(f"pass rule per element: |ort - torch| <= atol + rtol * |torch|, {tol.judging(rows)}")
    return "\n".join(lines)
