"""Parity: the whole greedy decode through onnxruntime against PyTorch, over a matrix of shapes.
Everything is measured first; then one typed error lists every failure."""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np
import torch
from tqdm import tqdm

from runtime.model import Seq2Seq
from training.decode import reference_decode
from training.models import EncoderDecoder

from .errors import ParityError

DEFAULT_ATOL = 1e-5
REL_FLOOR = 1e-6  # denominators below this count as this, so exact zeros do not blow up the ratio
BATCH_SIZES = (1, 3, 64)
SOURCE_LENS = (1, 2, 7)
TARGET_LENS = (1, 2, 20)
PAD_FILL_SCALE = 5.0  # padding holds large garbage: a leak through the mask would show


@dataclass(frozen=True)
class Case:
    """One decode to compare: a batch of sources, its mask and the number of steps."""

    name: str
    source: np.ndarray  # (N, Ls, F) float32
    mask: np.ndarray  # (N, 1, Ls) bool
    target_len: int


@dataclass(frozen=True)
class Row:
    """Max differences of one output of one case."""

    case: str
    batch: int
    source_len: int
    target_len: int
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
        out.append(Case(f"{name} [{start}:{start + len(part)}]", part, np.ones((len(part), 1, part.shape[1]), bool), target_len))
    return out


def diffs(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Max absolute and max relative difference (0 for empty arrays)."""
    if expected.size == 0:
        return 0.0, 0.0
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    return float(err.max()), float((err / np.maximum(np.abs(expected), REL_FLOOR)).max())


def compare(model: EncoderDecoder, runtime: Seq2Seq, case: Case, atol: float) -> list[Row]:
    """Decode one case both ways; one row per output."""
    ref_out, ref_alphas = reference_decode(model, torch.from_numpy(case.source), case.target_len, torch.from_numpy(case.mask))
    out, alphas = runtime.predict(case.source, case.target_len, case.mask, return_attention=True)
    pairs = {"outputs": (out, ref_out.numpy())}
    if ref_alphas is not None:
        pairs["attention"] = (alphas, ref_alphas.numpy())
    rows = []
    for output, (got, want) in pairs.items():
        if got.shape != want.shape:
            rows.append(Row(case.name, *case.source.shape[:2], case.target_len, output, float("inf"), float("inf"), False))
            continue
        max_abs, max_rel = diffs(got, want)
        rows.append(Row(case.name, *case.source.shape[:2], case.target_len, output, max_abs, max_rel, max_abs <= atol))
    return rows


def run_parity(model: EncoderDecoder, runtime: Seq2Seq, cases: Iterable[Case], atol: float = DEFAULT_ATOL,
               progress: bool = False) -> list[Row]:
    """Compare every case; returns all rows (see `raise_on_failure`)."""
    model.eval()
    cases = list(cases)
    rows = []
    for case in tqdm(cases, desc="parity", unit="case", disable=not progress, leave=False):
        rows.extend(compare(model, runtime, case, atol))
    return rows


def summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Worst max_abs/max_rel per output over all cases."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        worst = out.setdefault(row.output, {"max_abs": 0.0, "max_rel": 0.0, "cases": 0})
        worst["max_abs"] = max(worst["max_abs"], row.max_abs)
        worst["max_rel"] = max(worst["max_rel"], row.max_rel)
        worst["cases"] += 1
    return out


def report(rows: list[Row], atol: float) -> dict:
    """The manifest's parity report: tolerance, per-output worst case and every row."""
    return {"atol": atol, "passed": all(r.ok for r in rows), "summary": summary(rows), "cases": [asdict(r) for r in rows]}


def raise_on_failure(rows: list[Row], atol: float) -> None:
    """One ParityError listing every failing output of every case."""
    failures = [r for r in rows if not r.ok]
    if failures:
        lines = [f"  {r.case}: {r.output} max_abs={r.max_abs:.3g} max_rel={r.max_rel:.3g}" for r in failures]
        raise ParityError(
            f"onnxruntime and PyTorch differ beyond atol={atol:g} in {len(failures)} of {len(rows)} checks:\n"
            + "\n".join(lines)
        )


def format_table(rows: list[Row], atol: float) -> str:
    """A fixed-width table of every row, then the per-output worst case."""
    head = f"{'case':<26} {'output':<10} {'max_abs':>10} {'max_rel':>10}  ok"
    lines = [head, "-" * len(head)]
    lines += [f"{r.case:<26} {r.output:<10} {r.max_abs:>10.2e} {r.max_rel:>10.2e}  {'yes' if r.ok else 'NO'}" for r in rows]
    lines.append("-" * len(head))
    for output, worst in summary(rows).items():
        lines.append(f"{'worst of ' + str(worst['cases']) + ' cases':<26} {output:<10} "
                     f"{worst['max_abs']:>10.2e} {worst['max_rel']:>10.2e}  (atol {atol:g})")
    return "\n".join(lines)
