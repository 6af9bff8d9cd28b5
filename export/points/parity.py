"""Parity of point models over a matrix of shapes: random sources of BATCH_SIZES x SOURCE_LENS x TARGET_LENS, right-
padded variants with garbage behind the mask, and real data in batches (see `export.parity` for the two checks and
the pass rule)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from tqdm import tqdm

from export.errors import VerifyError
from export.parity import Row, Say, Tolerance, diffs
from runtime.defaults import DEFAULT_ATOL, DEFAULT_DRIFT_ATOL
from runtime.errors import UsageError
from runtime.model import Seq2Seq
from runtime.points import greedy_decode
from runtime.spec import ModelSpec
from training.checkpoint import read_data_description
from training.data import DataError
from training.points.data import is_point_data, load_dataset, reload_dataset
from training.points.decode import decode_step, encode, reference_decode
from training.points.models import EncoderDecoder

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


def compare(model: EncoderDecoder, runtime: Seq2Seq, case: Case, tol: Tolerance) -> list[Row]:
    """Every output of one case, each with its max abs/rel difference and verdict."""
    rows = []
    shape = (*case.source.shape[:2], case.target_len)
    for check, pairs, atol, accepted in (("graph", graph_pairs(model, runtime, case), tol.atol, DEFAULT_ATOL),
                                         ("decode", decode_pairs(model, runtime, case), tol.drift_atol,
                                          DEFAULT_DRIFT_ATOL)):
        for output, (got, want) in pairs.items():
            rows.append(Row(case.name, *shape, check, output, *diffs(got, want, atol, tol.rtol, accepted)))
    return rows


def run_parity(model: EncoderDecoder, runtime: Seq2Seq, cases: Iterable[Case], tol: Tolerance = Tolerance(),
               progress: bool = False) -> list[Row]:
    """Compare every case; returns all rows (see `raise_on_failure`)."""
    model.eval()
    cases = list(cases)
    rows = []
    # only on a terminal (disable=None): a bar that leaves nothing, written to a file, left its frames and a
    # carriage return on the line that follows (verify's Error: line)
    for case in tqdm(cases, desc="parity", unit="case", disable=None if progress else True, leave=False):
        rows.extend(compare(model, runtime, case, tol))
    return rows


def parity(model: EncoderDecoder, runtime: Seq2Seq, tol: Tolerance, progress: bool = False) -> list[Row]:
    """What every export checks: the random matrix (`matrix_cases`)."""
    return run_parity(model, runtime, matrix_cases(runtime.spec.n_features), tol, progress=progress)


def verify_rows(checkpoint: Path, data: str | None, model: EncoderDecoder, runtime: Seq2Seq, tol: Tolerance,
                note: Say) -> list[Row]:
    """What `verify` checks: the random matrix, then real data (--data, else the checkpoint's own if found)."""
    spec = runtime.spec
    return run_parity(model, runtime, matrix_cases(spec.n_features) + dataset_cases(checkpoint, data, spec, note),
                      tol, progress=True)


def dataset_cases(checkpoint: Path, data: str | None, spec: ModelSpec, note: Say) -> list[Case]:
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


def test_inputs(source: str | Path, spec: ModelSpec, name: str | None) -> np.ndarray | None:
    """The test split's sources (N, L, F) of `name`, else of the checkpoint's own data; None when there are none
    or their features differ from the model's."""
    try:
        if name is None and read_data_description(source) is None:
            return None
        _, test = load_dataset(name) if name else reload_dataset(read_data_description(source))
        return test.source if test.n_features == spec.n_features else None
    except (DataError, OSError):
        return None
