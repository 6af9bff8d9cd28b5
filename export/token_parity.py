"""Parity for token models, in the two checks the point models use:

- graphs: the step's log-probs (and attention) along PyTorch's own greedy trajectory, given identical inputs;
- decode: greedy and beam-search token ids through the runtime must be identical to the same search driven by
  PyTorch (ids are exact: a difference is a failure whatever the tolerance).
"""
from __future__ import annotations

import numpy as np

from runtime.contract import state_batch_axes
from runtime.model import Seq2Seq
from runtime.search import beam_search, greedy_search
from runtime.token_steps import TokenSteps  # the type of runtime.token_steps
from runtime.vocab import BOS, EOS, PAD
from training.token_base import TokenModel, torch_steps

from .parity import Row, Tolerance

TOKEN_CASES = ((1, 1), (1, 7), (4, 6), (16, 12))  # (batch, padded source length)
DATA_BATCHES = (1, 8, 64)  # real texts: consecutive chunks of these sizes, each padded to its longest row
PARITY_STEPS = 12
PARITY_BEAM = 3
DATA_STEP_MARGIN = 2  # real texts decode up to the longest training target (EOS included) plus this


def token_batch(spec_vocab: int, n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random right-padded ids (n, length) and lengths (n,), with real lengths varying inside the batch."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, size=n).astype(np.int64)
    ids = rng.integers(EOS + 2, spec_vocab, size=(n, length)).astype(np.int64)  # no specials inside sources
    ids[np.arange(length)[None, :] >= lengths[:, None]] = PAD
    return ids, lengths


def run_token_parity(model: TokenModel, runtime: Seq2Seq, tol: Tolerance) -> list[Row]:
    """Every check of every case, measured before judging."""
    spec = model.spec
    steps = runtime.token_steps
    rows = []
    for i, (n, length) in enumerate(TOKEN_CASES):
        ids, lengths = token_batch(spec.source_vocab_size, n, length, seed=i)
        case = f"b{n} s{length}"
        rows.append(_graph_row(case, steps, model, ids, lengths, tol))
        rows.extend(_decode_rows(case, steps, model, ids, lengths))
    return rows


def run_token_data_parity(model: TokenModel, runtime: Seq2Seq, texts: list[str], name: str,
                          tol: Tolerance) -> list[Row]:
    """The same checks on real texts, encoded as the runtime encodes them, in batches of DATA_BATCHES sizes."""
    vocab = runtime.vocabularies["source"]
    max_len = model.spec.target_len + DATA_STEP_MARGIN
    rows, start = [], 0
    for n in DATA_BATCHES:
        chunk = texts[start:start + n]
        start += n
        if not chunk:
            break
        ids, lengths = vocab.encode_batch(chunk, add_eos=True, reverse=model.spec.reverse_source)
        case = f"{name} b{len(chunk)} s{ids.shape[1]}"
        rows.append(_graph_row(case, runtime.token_steps, model, ids, lengths, tol))
        rows.extend(_decode_rows(case, runtime.token_steps, model, ids, lengths, max_len))
    return rows


def _graph_row(case: str, steps: TokenSteps, model: TokenModel, ids: np.ndarray, lengths: np.ndarray,
               tol: Tolerance) -> Row:
    """Step log-probs, both sides fed PyTorch's greedy choices, worst absolute and relative difference."""
    ort_state = steps.encode(ids, lengths)
    torch_state, torch_step = torch_steps(model, ids, lengths)
    tokens = np.full(len(ids), BOS, dtype=np.int64)
    worst_abs = worst_rel = 0.0
    ok = True
    for _ in range(PARITY_STEPS):
        got, want = steps.step(tokens, ort_state), torch_step(tokens, torch_state)
        diff = np.abs(got.log_probs - want.log_probs)
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / np.maximum(np.abs(want.log_probs), 1e-12)).max()))
        ok &= bool(np.allclose(got.log_probs, want.log_probs, atol=tol.atol, rtol=tol.rtol))
        ort_state, torch_state, tokens = got.state, want.state, want.log_probs.argmax(-1)
    return Row(case, len(ids), ids.shape[1], PARITY_STEPS, "graph", "step.log_probs", worst_abs, worst_rel, ok)


def _decode_rows(case: str, steps: TokenSteps, model: TokenModel, ids: np.ndarray, lengths: np.ndarray,
                 max_len: int = PARITY_STEPS) -> list[Row]:
    """Greedy and beam ids through the runtime vs the same searches driven by PyTorch (differing sequences)."""
    axes = state_batch_axes(model.spec)
    common = dict(batch_size=len(ids), bos_id=BOS, eos_id=EOS, max_decoding_length=max_len)
    rows = []
    for name, search, extra in (("greedy.ids", greedy_search, {}),
                                ("beam.ids", beam_search, {"beam_size": PARITY_BEAM, "num_hypotheses": PARITY_BEAM})):
        got = search(steps.step, steps.encode(ids, lengths), steps.batch_axes, **common, **extra)
        state, step = torch_steps(model, ids, lengths)
        want = search(step, state, axes, **common, **extra)
        differing = sum(_ids(a) != _ids(b) for a, b in zip(got, want))
        rows.append(Row(case, len(ids), ids.shape[1], max_len, "decode", name, float(differing), 0.0,
                        differing == 0))
    return rows


def _ids(found: object) -> list:
    return [h.tokens for h in found] if isinstance(found, list) else found.tokens
