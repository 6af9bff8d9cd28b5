"""Parity for token models, in the two checks the point models use:

- graphs: the step's log-probs along PyTorch's own greedy trajectory, given identical inputs; and for
  transformers, the cached step graph fed a fixed target token by token against PyTorch's full-sequence decoder
  (causal mask, every position at once) at every position: the cache computes what the training-time decoder does;
- decode: greedy and beam-search token ids through the runtime must be identical to the same search driven by
  PyTorch (ids are exact: a difference is a failure whatever the tolerance).

A transformer reads position i at row i of its position table, so its cases stop at spec.max_positions source
tokens and decoding steps (the runtime refuses more).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.errors import VerifyError
from export.parity import Row, Say, Tolerance, diffs, within_rounding
from runtime.errors import UsageError
from runtime.evaluate import UNK_WARN_FRACTION, unknown_fraction
from runtime.model import Seq2Seq
from runtime.optional_graphs import fold_tokens, folds
from runtime.search import Hypothesis, beam_search, greedy_search
from runtime.spec import ModelSpec
from runtime.tokens import (
    TokenSteps,  # the type of runtime.token_steps
    encode_sources,
    source_token_limit,
)
from runtime.vocab import BOS, EOS, VocabError
from training.checkpoint import read_data_description
from training.data import DataError
from training.points.data import is_point_data
from training.tokens.base import TokenModel
from training.tokens.data import load_text_dataset, reload_text_dataset

from .sides import OwnModel, TorchSide, side_of, token_batch  # noqa: F401  (token_batch: export.quality's too)

TOKEN_CASES = ((1, 1), (1, 7), (2, 3), (4, 6), (16, 12))  # (batch, padded source length)
DATA_BATCHES = (1, 8, 64)  # real texts: consecutive chunks of these sizes, each padded to its longest row
PARITY_STEPS = 12
PARITY_BEAM = 3
DATA_STEP_MARGIN = 2  # real texts decode up to the longest training target (EOS included) plus this


def position_limit(spec: ModelSpec, wanted: int) -> int:
    """`wanted` source tokens or decoding steps, at most a transformer's max_positions."""
    return min(wanted, spec.max_positions) if spec.is_transformer else wanted


def fitting_texts(texts: list[str], runtime: Seq2Seq) -> list[str]:
    """The texts the model reads (specials included: a transformer's position table, a declared model's bound);
    the runtime refuses the others."""
    contract, vocab = runtime.contract, runtime.vocabularies["source"]
    rules = contract.sources
    limit = source_token_limit(runtime.spec, contract)  # the runtime's own bound: parity checks what it accepts
    return [t for t in texts if _fits(vocab, t, rules) and len(vocab.encode(t, rules.add_bos, rules.add_eos)) <= limit]


def _fits(vocab: Any, text: str, rules: Any) -> bool:
    """Whether the vocabulary can encode the text (one without an unknown id refuses unseen tokens)."""
    try:
        vocab.encode(text, rules.add_bos, rules.add_eos)
    except VocabError:
        return False
    return True


def run_token_parity(model: Any, runtime: Seq2Seq, tol: Tolerance) -> list[Row]:
    """Every check of every case, measured before judging: `model` is a token model or a probed adapter."""
    side = side_of(model)
    rows = []
    for i, (n, length) in enumerate(TOKEN_CASES + _plain_case(side.spec, runtime)):
        ids, lengths = side.sources(n, length, seed=i)
        rows.extend(_case_rows(f"b{n} s{ids.shape[1]}", runtime, side, ids, lengths, tol, PARITY_STEPS))
    return rows


def _plain_case(spec: ModelSpec, runtime: Seq2Seq) -> tuple[tuple[int, int], ...]:
    """A transformer with folded graphs (fold_greedy, fold_beam and fold_few_beam, which the runtime sends calls of
    at most fold_tokens source tokens; TOKEN_CASES's b1 and b2 cases run fold_few_beam, b4 fold_beam where they fold):
    one more case, just past the bound, so that the plain fast graphs are checked too (TOKEN_CASES may all fold)."""
    if runtime.token_steps.fast is None or not folds(spec):
        return ()
    length = position_limit(spec, max(length for _, length in TOKEN_CASES))
    return ((fold_tokens(spec) // length + 1, length),)


def run_token_data_parity(model: Any, runtime: Seq2Seq, texts: list[str], name: str, tol: Tolerance) -> list[Row]:
    """The same checks on real texts, encoded as the runtime encodes them, in batches of DATA_BATCHES sizes
    (texts the model cannot read are left out: see `fitting_texts`)."""
    side, vocab = side_of(model), runtime.vocabularies["source"]
    texts = fitting_texts(texts, runtime)
    max_len = side.spec.target_len + DATA_STEP_MARGIN
    rows, start = [], 0
    for n in DATA_BATCHES:
        chunk = texts[start:start + n]
        start += n
        if not chunk:
            break
        ids, lengths = encode_sources(chunk, vocab, runtime.spec, runtime.contract)
        rows.extend(_case_rows(f"{name} b{len(chunk)} s{ids.shape[1]}", runtime, side, ids, lengths, tol,
                               max_len))
    return rows


def _case_rows(case: str, runtime: Seq2Seq, side: TorchSide, ids: np.ndarray, lengths: np.ndarray,
               tol: Tolerance, max_len: int) -> list[Row]:
    """Every check of one batch: graph rows over PARITY_STEPS (a transformer's full-sequence row too), then decode
    rows up to `max_len` tokens."""
    plain, n_steps = runtime.token_steps, position_limit(side.spec, PARITY_STEPS)
    rows = []
    variants = [(plain, "")]
    if plain.fast is not None:  # a transformer's fast graphs, fused-kernel and wide: the same checks
        variants.append((plain.fast.only(wide=False), "fast."))
        if plain.fast.wide is not None:
            variants.append((plain.fast.only(wide=True), "wide."))
    for steps, prefix in variants:
        case_rows = [_graph_row(case, steps, side, ids, lengths, tol, n_steps)]
        if isinstance(side, OwnModel) and side.spec.is_transformer:
            case_rows.append(_sequence_row(case, steps, side.model, ids, lengths, tol, n_steps))
        case_rows += _decode_rows(case, steps, side, ids, lengths, position_limit(side.spec, max_len), tol)
        rows += [dataclasses.replace(row, output=prefix + row.output) for row in case_rows]
    return rows


def _graph_row(case: str, steps: TokenSteps, side: TorchSide, ids: np.ndarray, lengths: np.ndarray,
               tol: Tolerance, n_steps: int = PARITY_STEPS) -> Row:
    """Step log-probs, both sides fed PyTorch's greedy choices, worst absolute and relative difference."""
    ort_state = steps.encode(ids, lengths)
    torch_state, torch_step = side.steps(ids, lengths)
    tokens = np.full(len(ids), side.contract.specials.bos, dtype=np.int64)
    worst_abs = worst_rel = 0.0
    ok = rounding = True
    for _ in range(n_steps):
        got, want = steps.step(tokens, ort_state), torch_step(tokens, torch_state)
        both = np.isfinite(want.log_probs) & np.isfinite(got.log_probs)  # never-emitted ids: -inf on both sides
        diff = np.abs(np.where(both, got.log_probs, 0.0) - np.where(both, want.log_probs, 0.0))
        odd = (np.isnan(got.log_probs) | np.isnan(want.log_probs)) | (np.isinf(got.log_probs) != np.isinf(
            want.log_probs))  # NaN, or -inf on one side only: no tolerance covers it
        diff = np.where(odd, np.inf, diff)
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / np.maximum(np.abs(np.where(both, want.log_probs, 1.0)),
                                                            1e-12)).max()))
        close = bool(np.allclose(got.log_probs.astype(np.float64), want.log_probs.astype(np.float64), atol=tol.atol,
                                 rtol=tol.rtol))  # in float64: a float32 atol of 1e300 overflowed, with a warning
        ok &= close
        rounding &= close or within_rounding(got.log_probs, want.log_probs, tol.atol, tol.rtol)
        ort_state, torch_state, tokens = got.state, want.state, want.log_probs.argmax(-1)
    return Row(case, len(ids), ids.shape[1], n_steps, "graph", "step.log_probs", worst_abs, worst_rel, ok, rounding)


def _sequence_row(case: str, steps: TokenSteps, model: TokenModel, ids: np.ndarray, lengths: np.ndarray,
                  tol: Tolerance, n_steps: int) -> Row:
    """Transformers: a fixed target (bos, then seeded random tokens) fed token by token through the cached step
    graph, against PyTorch's full-sequence decoder over the same target, position by position."""
    rng = np.random.default_rng([len(ids), ids.shape[1], n_steps])
    target_in = rng.integers(EOS + 1, model.spec.target_vocab_size, size=(len(ids), n_steps))  # (N, T)
    target_in[:, 0] = BOS
    with torch.no_grad():
        state = model.encode(torch.from_numpy(ids), torch.from_numpy(lengths))
        want = model.decode_sequence(state, torch.from_numpy(target_in)).numpy()  # (N, T, V)
    ort_state, got = steps.encode(ids, lengths), []
    for t in range(n_steps):
        result = steps.step(target_in[:, t], ort_state)
        got.append(result.log_probs)
        ort_state = result.state
    got_all = np.stack(got, axis=1)  # (N, T, V)
    return Row(case, len(ids), ids.shape[1], n_steps, "graph", "sequence.log_probs",
               *diffs(got_all, want, tol.atol, tol.rtol))


def _decode_rows(case: str, steps: TokenSteps, side: TorchSide, ids: np.ndarray, lengths: np.ndarray,
                 max_len: int = PARITY_STEPS, tol: Tolerance = Tolerance()) -> list[Row]:
    """Greedy and beam ids through the runtime vs the same searches driven by PyTorch (differing sequences); a
    declared model's own greedy decode too, when it gave one."""
    specials = side.contract.specials
    common = dict(batch_size=len(ids), bos_id=specials.bos, eos_id=specials.eos, max_decoding_length=max_len)
    rows = []
    for name, search, extra in (("greedy.ids", greedy_search, {}),
                                ("beam.ids", beam_search, {"beam_size": PARITY_BEAM, "num_hypotheses": PARITY_BEAM})):
        got = search(steps.step, steps.encode(ids, lengths), steps.batch_axes, **common, **extra)
        state, step = side.steps(ids, lengths)
        want = search(step, state, side.contract.batch_axes, **common, **extra)
        rows.append(_ids_row(case, ids, max_len, name, got, want))
        if name == "greedy.ids" and steps.greedy is not None:  # the greedy loop graph: what translate runs
            fused = steps.greedy_tokens(ids, lengths, max_len, 0, False)
            rows.append(_ids_row(case, ids, max_len, "greedy_loop.ids", fused, want))
        if name == "greedy.ids" and side.reference is not None:  # the model's own decode, untouched
            own = side.reference(torch.from_numpy(ids), torch.from_numpy(lengths), max_len)
            rows.append(_ids_row(case, ids, max_len, "reference.ids", got,
                                 [Hypothesis([int(i) for i in row], 0.0, 0.0) for row in own]))
        graph = steps.beam_graph(*ids.shape, PARITY_BEAM)
        if name == "beam.ids" and graph is not None:  # the beam search graph: its ids, and its scores against
            found = graph.hypotheses(ids, lengths, PARITY_BEAM, PARITY_BEAM, 1.0, max_len, 0)  # the numpy search's
            rows.append(_ids_row(case, ids, max_len, "beam_graph.ids", found, want))
            rows.append(_scores_row(case, ids, max_len, found, got, tol, "beam_graph"))
        if name == "beam.ids" and steps.has_beam_step:  # the beam step: what translate's beam search runs
            found = search(steps.beam_step, steps.encode(ids, lengths), steps.batch_axes, **common, **extra,
                           constant=steps.constant, per_input=True)
            rows.append(_ids_row(case, ids, max_len, "beam_step.ids", found, want))
            rows.append(_scores_row(case, ids, max_len, found, got, tol, "beam_step"))
    return rows


def _scores_row(case: str, ids: np.ndarray, max_len: int, found: list, got: list, tol: Tolerance,
                graph: str) -> Row:
    """A one-call beam graph's, or the beam step's, scores and log-probs against the numpy search's over the step
    graph (float32 rounding apart: their attention reads an input's beams as one block)."""
    pairs = [(a, b) for x, y in zip(found, got) for a, b in zip(x, y)]
    ours = np.array([[a.score, a.log_prob] for a, _ in pairs] or np.zeros((0, 2)))
    numpy = np.array([[b.score, b.log_prob] for _, b in pairs] or np.zeros((0, 2)))
    same_count = all(len(x) == len(y) for x, y in zip(found, got))
    max_abs, max_rel, ok, rounding = diffs(ours, numpy, tol.atol, tol.rtol) if pairs else (0.0, 0.0, True, True)
    return Row(case, len(ids), ids.shape[1], max_len, "decode", f"{graph}.scores", max_abs, max_rel,
               ok and same_count, rounding and same_count)


def _ids_row(case: str, ids: np.ndarray, max_len: int, name: str, got: list, want: list) -> Row:
    """A decode row: how many sequences differ (ids are exact)."""
    differing = sum(_ids(a) != _ids(b) for a, b in zip(got, want))
    return Row(case, len(ids), ids.shape[1], max_len, "decode", name, float(differing), 0.0, differing == 0)


def _ids(found: object) -> list:
    return [h.tokens for h in found] if isinstance(found, list) else found.tokens


def parity(model: Any, runtime: Seq2Seq, tol: Tolerance, progress: bool = False) -> list[Row]:
    """What every export checks: random ids over TOKEN_CASES (`run_token_parity`)."""
    return run_token_parity(model, runtime, tol)


def verify_rows(checkpoint: Path, data: str | None, model: Any, runtime: Seq2Seq, tol: Tolerance,
                note: Say) -> list[Row]:
    """Token models: the random-id matrix, then real texts (--data, else the checkpoint's own data if found):
    step log-probs within tolerance (transformers: also the cached step against the full-sequence decoder at every
    position), greedy and beam ids identical, over batch sizes and padded lengths."""
    if data is not None and is_point_data(data):  # a usage error, before any work
        raise UsageError(f"{data!r} is point data; {checkpoint} is a token model: pass a text data set",
                         param="--data")
    rows = run_token_parity(model, runtime, tol)
    if data is None and not isinstance(side_of(model), OwnModel):
        note("note: a declared model has no training data on record; comparing on random ids only (pass --data "
             "to compare on real texts)")
        return rows
    try:
        train, test = load_text_dataset(data) if data is not None else reload_text_dataset(
            read_data_description(checkpoint) or {})
    except DataError as exc:
        if data is not None:
            raise VerifyError(f"--data: {exc}") from None
        note(f"note: the checkpoint's training data cannot be reloaded ({exc}); comparing on random ids only "
             "(pass --data to compare on real texts)")
        return rows
    splits = {"test": list(test.sources), "train": list(train.sources)}
    fitting = {name: fitting_texts(texts, runtime) for name, texts in splits.items()}  # what the runtime reads
    vocab = runtime.vocabularies["source"]  # without an unknown id, texts it lacks are left out instead
    share = (unknown_fraction(vocab, fitting["test"] + fitting["train"])
             if data is not None and vocab.ids.unk is not None else 0.0)
    if share > UNK_WARN_FRACTION:  # they all read as <unk>: little real text is compared
        note(f"warning: {share:.0%} of the source tokens of {data!r} are not in the model's source vocabulary (they "
             "become <unk>), so the real-text checks compare little real text; pass data the model was made for")
    why = (f"longer than the transformer's max_positions {runtime.spec.max_positions} (</s> included)"
           if runtime.spec.is_transformer else "longer than the model reads, or hold tokens its vocabulary lacks")
    compared = len(fitting["test"]) + len(fitting["train"])
    for name, texts in splits.items():
        left_out = len(texts) - len(fitting[name])
        if left_out:
            rest = "comparing on the others" if fitting[name] else "none is left"
            note(f"note: {left_out} {name} text(s) are {why}, which the runtime refuses; {rest}")
        rows += run_token_data_parity(model, runtime, fitting[name], name, tol)
    if not compared and data is not None:
        raise VerifyError(f"--data: none of the {len(test.sources) + len(train.sources)} texts of {data!r} can be "
                          f"read by the model (they are {why}); nothing of it was compared: pass data the model "
                          "was made for")
    return rows


def test_inputs(source: str | Path, spec: ModelSpec, name: str | None) -> list[str] | None:
    """The test split's source texts of `name`, else of the checkpoint's own data; None when there are none."""
    try:
        _, test = load_text_dataset(name) if name else reload_text_dataset(read_data_description(source) or {})
    except (DataError, OSError):
        return None
    return list(test.sources)
