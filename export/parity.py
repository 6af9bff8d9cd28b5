"""Parity between onnxruntime and PyTorch over a matrix of shapes, measured in two ways:

- graphs: every encoder output, and every decoder-step output at every step, given identical inputs
  (PyTorch's own decode trajectory). This isolates the graphs; `atol` applies (default 1e-5).
- decode: the whole free-running greedy decode through the runtime's loop. Float32 rounding differences
  are fed back and can grow with the model's dynamics, so `drift_atol` applies (default 1e-3); a loop bug
  (state not fed back, wrong mask) shows up far above it.
An element passes when |onnxruntime - pytorch| <= tol + rtol * |pytorch| (numpy's allclose rule), so
large values are not held to an absolute bar that float32 cannot meet. Everything is measured first;
then one typed error lists every failure.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np
import torch
from tqdm import tqdm

from runtime.decode import greedy_decode
from runtime.defaults import DEFAULT_ATOL, DEFAULT_DRIFT_ATOL, DEFAULT_RTOL
from runtime.model import Seq2Seq
from training.decode import decode_step, encode, reference_decode
from training.models import EncoderDecoder

from .errors import ParityError

REL_FLOOR = 1e-6  # denominators below this count as this, so exact zeros do not blow up the ratio
BATCH_SIZES = (1, 3, 64)
SOURCE_LENS = (1, 2, 7)
TARGET_LENS = (1, 2, 20)
PAD_FILL_SCALE = 5.0  # padding holds large garbage: a leak through the mask would show
STEP_OUTPUTS = ("output", "hidden_out", "alphas")


@dataclass(frozen=True)
class Case:
    """One decode to compare: a batch of sources, its mask and the number of steps."""

    name: str
    source: np.ndarray  # (N, Ls, F) float32
    mask: np.ndarray  # (N, 1, Ls) bool
    target_len: int


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


def matrix_cases(n_features: int, seed: int = 0) -> list[Case]:
    """Random sources over BATCH_SIZES x SOURCE_LENS x TARGET_LENS, plus right-padded variants."""
    rng = np.random.default_rng(seed)
    cases = []
    for n, ls, lt in itertools.product(BATCH_SIZES, SOURCE_LENS, TARGET_LENS):
        source = rng.normal(size=(n, ls, n_features)).astype(np.float32)
        cases.append(Case(f"random b{n} s{ls} t{lt}", source, np.ones((n, 1, ls), dtype=bool), lt))
        if ls > 1:
            cases.append(padded_case(rng, source, lt))
    return cases


def padded_case(rng: np.random.Generator, source: np.ndarray, target_len: int) -> Case:
    """Right-pad random items: random valid lengths (the first item always padded), garbage after."""
    n, ls, _ = source.shape
    lengths = rng.integers(1, ls + 1, size=n)
    lengths[0] = ls - 1
    mask = np.arange(ls)[None, None, :] < lengths[:, None, None]  # (N, 1, Ls)
    garbage = (rng.normal(size=source.shape) * PAD_FILL_SCALE).astype(np.float32)
    padded = np.where(mask.transpose(0, 2, 1), source, garbage)  # (N, Ls, F)
    return Case(f"padded b{n} s{ls} t{target_len}", padded, mask, target_len)


def data_cases(name: str, source: np.ndarray, target_len: int, batch: int = 256) -> list[Case]:
    """Cases from real sources (e.g. the training data), in batches."""
    out = []
    for start in range(0, len(source), batch):
        part = np.ascontiguousarray(source[start : start + batch], dtype=np.float32)
        full = np.ones((len(part), 1, part.shape[1]), dtype=bool)
        out.append(Case(f"{name} [{start}:{start + len(part)}]", part, full, target_len))
    return out


def diffs(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """Max absolute and relative difference, and whether every element is within atol + rtol*|expected|."""
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), False
    if expected.size == 0:
        return 0.0, 0.0, True
    want = expected.astype(np.float64)
    err = np.abs(actual.astype(np.float64) - want)
    ok = bool(np.all(err <= atol + rtol * np.abs(want)))
    return float(err.max()), float((err / np.maximum(np.abs(want), REL_FLOOR)).max()), ok


@torch.no_grad()
def graph_pairs(model: EncoderDecoder, runtime: Seq2Seq, case: Case) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(onnxruntime, PyTorch) for every graph output; steps are fed PyTorch's trajectory."""
    source, mask = torch.from_numpy(case.source), torch.from_numpy(case.mask)
    states = encode(model, source, mask)
    got = runtime.run_encoder({"source": case.source, "source_mask": case.mask})
    pairs = {f"encoder.{k}": (got[k], states[k].numpy()) for k in states}
    known = {k: v.numpy() for k, v in states.items()} | {"source_mask": case.mask}
    feed = {k: known[k] for k in runtime.step_inputs}
    x, hidden = states["decoder_input"], states["hidden"]
    steps: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for _ in range(case.target_len):
        result = runtime.run_step(feed | {"decoder_input": x.numpy(), "hidden": hidden.numpy()})
        x, hidden, alphas = decode_step(model, states, x, hidden, mask)
        for name, want in zip(STEP_OUTPUTS, (x, hidden, alphas)):
            if want is not None:
                steps.setdefault(name, []).append((result[name], want.numpy()))
    for name, seq in steps.items():
        pairs[f"step.{name}"] = (np.stack([g for g, _ in seq]), np.stack([w for _, w in seq]))
    return pairs


def decode_pairs(model: EncoderDecoder, runtime: Seq2Seq, case: Case) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(onnxruntime, PyTorch) for the free-running greedy decode."""
    ref, ref_alphas = reference_decode(model, torch.from_numpy(case.source), case.target_len, torch.from_numpy(case.mask))
    out, alphas = runtime.predict(case.source, case.target_len, case.mask, return_attention=True)
    pairs = {"decode.outputs": (out, ref.numpy())}
    if ref_alphas is not None:
        pairs["decode.attention"] = (alphas, ref_alphas.numpy())
    if runtime.has_fused:  # predict ran the greedy loop graph; the step loop (beam's and old exports' path) too
        pairs["decode.step_loop.outputs"] = (step_loop_decode(runtime, case)[0], ref.numpy())
    return pairs


def step_loop_decode(runtime: Seq2Seq, case: Case) -> tuple[np.ndarray, np.ndarray | None]:
    """The runtime's step-by-step greedy decode (encoder, then the step graph once per output), whatever `predict`
    uses: outputs (N, Lt, F) and attention or None."""
    return greedy_decode(runtime.run_encoder, runtime.run_step, runtime.step_inputs, case.source, case.mask,
                         case.target_len)


@dataclass(frozen=True)
class Tolerance:
    """atol for graph outputs, drift_atol for the free-running decode, rtol for both."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    drift_atol: float = DEFAULT_DRIFT_ATOL

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "drift_atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: expected a finite tolerance >= 0, got {value!r}")

    def __str__(self) -> str:
        return f"atol={self.atol:g} (graphs), drift_atol={self.drift_atol:g} (decode), rtol={self.rtol:g}"


def compare(model: EncoderDecoder, runtime: Seq2Seq, case: Case, tol: Tolerance) -> list[Row]:
    """Every output of one case, each with its max abs/rel difference and verdict."""
    rows = []
    shape = (*case.source.shape[:2], case.target_len)
    for check, pairs, atol in (("graph", graph_pairs(model, runtime, case), tol.atol),
                               ("decode", decode_pairs(model, runtime, case), tol.drift_atol)):
        for output, (got, want) in pairs.items():
            rows.append(Row(case.name, *shape, check, output, *diffs(got, want, atol, tol.rtol)))
    return rows


def run_parity(model: EncoderDecoder, runtime: Seq2Seq, cases: Iterable[Case], tol: Tolerance = Tolerance(),
               progress: bool = False) -> list[Row]:
    """Compare every case; returns all rows (see `raise_on_failure`)."""
    model.eval()
    cases = list(cases)
    rows = []
    for case in tqdm(cases, desc="parity", unit="case", disable=not progress, leave=False):
        rows.extend(compare(model, runtime, case, tol))
    return rows


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


def raise_on_failure(rows: list[Row], tol: Tolerance) -> None:
    """One ParityError listing every failing output of every case."""
    failures = [r for r in rows if not r.ok]
    if failures:
        lines = [f"  {r.case}: {r.output} max_abs={r.max_abs:.3g} max_rel={r.max_rel:.3g}" for r in failures]
        raise ParityError(f"onnxruntime and PyTorch differ beyond {tol} in {len(failures)} of {len(rows)} checks:\n"
                          + "\n".join(lines))


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
        atol = tol.drift_atol if output.startswith("decode.") else tol.atol
        lines.append(f"{output:<26} {worst['max_abs']:>14.2e} {worst['max_rel']:>14.2e} {atol:>14g}"
                     + (f"  {worst['failed']} FAILED" if worst["failed"] else ""))
    lines.append(f"pass rule per element: |ort - torch| <= atol + rtol * |torch|, {tol}")
    return "\n".join(lines)
