"""How much a reduced-precision export (int8, fp16) loses against its own float32 graphs, both run by onnxruntime
on the same inputs through the runtime's own decode loops:

- point models: the free-running greedy decode over the parity matrix (and real sources when given), through the
  step graph and, when both exports hold one, the greedy loop graph; per case the max abs/rel difference of the
  outputs, that difference relative to the reference outputs' largest magnitude (judged), and the max abs
  difference of the attention weights (judged);
- token models: greedy and beam-5 ids through the step graph, and greedy ids through the greedy loop graph when
  both hold one, on seeded random source ids (and real texts when given); per set the sequence exact-match rate and
  the token agreement (judged), and the step log-probs' max abs difference along the reference's greedy path
  (reported only: the log-prob of a token nobody picks may move a lot and change nothing).

Token agreement compares two outputs position by position up to the longer one, </s> included (so stopping early
or late counts), over every sequence of the set.

What is judged: real data when there is some (the checkpoint's own, or given); the random inputs are then reported
only. A trained model never saw random inputs, and on them precision changes its answers far more often (int8 on
the trained dates model: 92% of greedy decodes equal on random ids, 100% on the 512 test dates): they would refuse
good exports. Without real data the random inputs are judged (point models: the matrix cases no longer than the
spec's input_len and target_len; longer free-running decodes feed errors back and measure the model's chaos).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from export.tokens.parity import (
    DATA_STEP_MARGIN,
    PARITY_STEPS,
    fitting_texts,
    position_limit,
    token_batch,
)
from export.tokens.sides import declared_sources
from runtime.model import Seq2Seq
from runtime.search import beam_search, greedy_search
from runtime.token_steps import TokenSteps
from runtime.tokens import encode_sources
from runtime.vocab import EOS
from training.tokens.base import NEVER_LOGIT

from .errors import ExportError
from .parity import REL_FLOOR
from .points.parity import Case, data_cases, matrix_cases, step_loop_decode
from .quality_rows import QualityRow, QualityTolerance, limit_of, make_row

QUALITY_BEAM = 5
RANDOM_SETS = ((1, 7), (16, 12), (64, 16), (64, 24))  # (batch, padded source length), seeded random ids
TEXT_BATCH = 64
MAX_TEXTS = 256  # real texts compared: the first this many
NEVER_OUTPUT = NEVER_LOGIT / 2  # a log-prob below this is an id the step never emits (<pad>, <s>)
ONE_BY_ONE = 32  # ... and the first this many one text a call, where the export has folded graphs (small calls only)


def quality_report(reference: Seq2Seq, candidate: Seq2Seq, tol: QualityTolerance = QualityTolerance(),
                   data: Any = None) -> list[QualityRow]:
    """Every measure of `candidate` against `reference` (the same model's float32 export); `data`: real sources
    (N, L, F) for a point model, texts for a token model, or None."""
    if reference.spec != candidate.spec:
        raise ExportError("quality_report: reference and candidate hold different models (their specs differ)")
    spec = reference.spec
    if spec.kind == "tokens":
        return token_quality(reference, candidate, tol, list(data) if data is not None else [])
    real = [] if data is None or not len(data) else data_cases("data", np.asarray(data, dtype=np.float32),
                                                                spec.target_len)
    rows = []
    for case in matrix_cases(spec.n_features):
        trained = case.source.shape[1] <= spec.input_len and case.target_len <= spec.target_len
        rows += point_quality(reference, candidate, case, tol if trained and not real else None)
    return rows + [row for case in real for row in point_quality(reference, candidate, case, tol)]


def point_quality(reference: Seq2Seq, candidate: Seq2Seq, case: Case,
                  tol: QualityTolerance | None) -> list[QualityRow]:
    """Output and attention differences of one free-running decode through the step graph, and through the greedy
    loop graph when both exports hold one (judged against `tol`, unless None)."""
    rows = _point_rows(case, "", step_loop_decode(reference, case), step_loop_decode(candidate, case), tol)
    if reference.has_fused and candidate.has_fused:
        loop = [r.predict(case.source, case.target_len, case.mask, return_attention=True)
                for r in (reference, candidate)]
        rows += [row for row in _point_rows(case, "loop.", *loop, tol)  # the judged measures only
                 if row.metric.endswith(("diff/scale", "attention.max_abs"))]
    return rows


def _point_rows(case: Case, prefix: str, reference: tuple, candidate: tuple,
                tol: QualityTolerance | None) -> list[QualityRow]:
    """Rows comparing one (outputs, attention) pair."""
    (want, want_att), (got, got_att) = reference, candidate
    err = np.abs(got.astype(np.float64) - want)
    scale = max(float(np.abs(want).max()), REL_FLOOR)
    n = len(case.source)
    relative = (err / np.maximum(np.abs(want), REL_FLOOR)).max()
    rows = [make_row(case.name, n, f"{prefix}outputs.max_abs", err.max(), None),
            make_row(case.name, n, f"{prefix}outputs.max_rel", relative, None),
            make_row(case.name, n, f"{prefix}outputs.diff/scale", err.max() / scale, limit_of(tol, "max_output_diff"))]
    if want_att is not None:
        rows.append(make_row(case.name, n, f"{prefix}attention.max_abs", np.abs(got_att - want_att).max(),
                             limit_of(tol, "max_attention_diff")))
    return rows


def token_quality(reference: Seq2Seq, candidate: Seq2Seq, tol: QualityTolerance, texts: list[str]) -> list[QualityRow]:
    """Random-id batches as one set, then the real texts (at most MAX_TEXTS) as another."""
    spec, contract, vocab = reference.spec, reference.contract, reference.vocabularies["source"]
    batches = [declared_sources(contract, vocab, n, length, seed=100 + i) if spec.is_declared else
               token_batch(spec.source_vocab_size, n, position_limit(spec, length), seed=100 + i)
               for i, (n, length) in enumerate(RANDOM_SETS)]
    max_len = position_limit(spec, max(PARITY_STEPS, spec.target_len + DATA_STEP_MARGIN))
    if contract.max_decoding_length is not None:
        max_len = min(max_len, contract.max_decoding_length)
    texts = fitting_texts(texts, reference)[:MAX_TEXTS]
    rows = _token_set("random ids", reference, candidate, batches, max_len, None if texts else tol)
    if texts:
        batches = [encode_sources(texts[i:i + TEXT_BATCH], vocab, spec, contract)
                   for i in range(0, len(texts), TEXT_BATCH)]
        text_len = position_limit(spec, spec.target_len + DATA_STEP_MARGIN)
        rows += _token_set("texts", reference, candidate, batches, text_len, tol)
        folded = candidate.token_steps.fast is not None and candidate.token_steps.fast.folded is not None
        if folded:  # batches of TEXT_BATCH are too large to fold: one text a call runs fold_greedy and fold_few_beam
            singles = [encode_sources([text], vocab, spec, contract) for text in texts[:ONE_BY_ONE]]
            rows += _token_set("texts one by one", reference, candidate, singles, text_len, tol)
    return rows


def _token_set(name: str, reference: Seq2Seq, candidate: Seq2Seq, batches: Sequence[tuple[np.ndarray, np.ndarray]],
               max_len: int, tol: QualityTolerance | None) -> list[QualityRow]:
    """Greedy and beam exact-match and agreement over every batch of a set (judged against `tol`, unless None), and
    the step log-prob difference."""
    count = sum(len(ids) for ids, _ in batches)
    rows = []
    ref_views, cand_views = _views(reference), _views(candidate)
    for prefix in [p for p in ref_views if p in cand_views]:  # the traced graphs, then a transformer's fast ones
        ref, cand = ref_views[prefix], cand_views[prefix]
        fused = ref.greedy is not None and cand.greedy is not None
        graphs = ref.beam is not None and cand.beam is not None  # a transformer's beam graphs, picked per batch
        for search in ("greedy", f"beam{QUALITY_BEAM}", *(["greedy_loop"] if fused else []),
                       *([f"beam_graph{QUALITY_BEAM}"] if graphs else [])):
            pairs = [pair for ids, lengths in batches
                     for pair in zip(_decode(ref, ids, lengths, max_len, search),
                                     _decode(cand, ids, lengths, max_len, search))]
            case = f"{name} {prefix}{search}"
            agreement = token_agreement(pairs, ref.contract.specials.eos)
            rows += [make_row(case, count, "exact_match", sum(a == b for a, b in pairs) / len(pairs),
                              limit_of(tol, "min_exact_match"), at_least=True),
                     make_row(case, count, "token_agreement", agreement, limit_of(tol, "min_token_agreement"),
                              at_least=True)]
        worst = max(_log_prob_diff(ref, cand, ids, lengths, max_len) for ids, lengths in batches)
        rows.append(make_row(f"{name} {prefix}greedy", count, "step.log_probs.max_abs", worst, None))
    return rows


def _views(runtime: Seq2Seq) -> dict[str, TokenSteps]:
    """The graphs a token export decodes with, by row-name prefix: the traced ones, and a transformer's fast
    fused-kernel and wide ones."""
    steps = runtime.token_steps
    views = {"": steps}
    if steps.fast is not None:
        views["fast "] = steps.fast.only(wide=False)
        if steps.fast.wide is not None:
            views["wide "] = steps.fast.only(wide=True)
    return views


def token_agreement(pairs: Sequence[tuple[list[int], list[int]]], eos: int = EOS) -> float:
    """Fraction of positions equal, each pair compared up to its longer sequence, eos appended to both."""
    equal = total = 0
    for a, b in pairs:
        a, b = [*a, eos], [*b, eos]
        equal += sum(x == y for x, y in zip(a, b))
        total += max(len(a), len(b))
    return equal / total if total else 1.0


def _decode(steps: TokenSteps, ids: np.ndarray, lengths: np.ndarray, max_len: int, search: str) -> list[list[int]]:
    """Token ids of the best hypothesis per row (without bos/eos)."""
    specials = steps.contract.specials
    common = dict(batch_size=len(ids), bos_id=specials.bos, eos_id=specials.eos, max_decoding_length=max_len)
    if search == "greedy":
        return [h.tokens for h in greedy_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, **common)]
    if search == "greedy_loop":
        return [h.tokens for h in steps.greedy_tokens(ids, lengths, max_len, 0, False)]
    if search == f"beam_graph{QUALITY_BEAM}":  # fast_beam, fold_(few_)beam or wide_beam, as translate picks them
        found = steps.beam_graph(*ids.shape, QUALITY_BEAM).hypotheses(ids, lengths, QUALITY_BEAM, 1, 1.0, max_len, 0)
        return [hyps[0].tokens if hyps else [] for hyps in found]
    found = beam_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, beam_size=QUALITY_BEAM,
                        num_hypotheses=1, **common)
    return [hyps[0].tokens for hyps in found]


def _log_prob_diff(ref: TokenSteps, cand: TokenSteps, ids: np.ndarray, lengths: np.ndarray, n_steps: int) -> float:
    """Max abs difference of the step log-probs, both sides fed the reference's greedy choices."""
    ref_state, cand_state = ref.encode(ids, lengths), cand.encode(ids, lengths)
    tokens = np.full(len(ids), ref.contract.specials.bos, dtype=np.int64)
    worst = 0.0
    for _ in range(n_steps):
        want, got = ref.step(tokens, ref_state), cand.step(tokens, cand_state)
        # ids never emitted: -inf on both sides, or at NEVER_LOGIT less the log-sum-exp, where float16 holds a value
        # to 8 (a difference of up to 4 that said nothing of the ids the model can emit)
        both = np.isfinite(want.log_probs) & np.isfinite(got.log_probs) & (want.log_probs > NEVER_OUTPUT)
        diff = np.abs(np.where(both, got.log_probs, 0.0).astype(np.float64) - np.where(both, want.log_probs, 0.0))
        worst = max(worst, float(diff.max()))
        ref_state, cand_state, tokens = want.state, got.state, want.log_probs.argmax(-1)
    return worst
