"""Token graphs: exported with symbolic batch/length, and onnxruntime equals PyTorch on padded batches of other
sizes, for GRU and LSTM, 1 and 2 layers, uni- and bidirectional, each attention kind."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.graphs import export_graphs
from runtime.contract import DECODER_STEP_FILE, ENCODER_FILE, FEEDBACK, graph_io, state_batch_axes
from runtime.spec import ModelSpec
from training.recurrent import BOS_ID, PAD_ID, TokenSeq2Seq

ATOL = 1e-5
VOCAB = 11
ATTENTION_CYCLE = ("dot", "additive", "none", "multihead")
# Every cell x layers x direction, each with one attention kind, cycling so every kind is covered by both cells.
COMBOS = [(cell, layers, bi, ATTENTION_CYCLE[i % len(ATTENTION_CYCLE)])
          for i, (cell, layers, bi) in enumerate(itertools.product(("gru", "lstm"), (1, 2), (False, True)))]


def spec_for(cell: str, layers: int, bidirectional: bool, attention: str) -> ModelSpec:
    """A tiny token spec."""
    return ModelSpec(kind="tokens", cell=cell, layers=layers, bidirectional=bidirectional, attention=attention,
                     n_heads=2 if attention == "multihead" else 1, hidden_dim=6, embedding_dim=5, source_vocab_size=VOCAB, target_vocab_size=VOCAB)


def batch(n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded random ids (n, length) and lengths (n,), the longest row shorter than `length` when n > 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, size=n)
    ids = rng.integers(4, VOCAB, size=(n, length))
    ids[np.arange(length)[None, :] >= lengths[:, None]] = PAD_ID
    return ids.astype(np.int64), lengths.astype(np.int64)


@pytest.fixture(scope="module", params=COMBOS, ids=lambda c: "-".join(map(str, c)))
def exported(request, tmp_path_factory) -> tuple[TokenSeq2Seq, ModelSpec, dict[str, ort.InferenceSession], Path]:
    """One export per combination, with its sessions."""
    spec = spec_for(*request.param)
    torch.manual_seed(0)
    model = TokenSeq2Seq(spec).eval()
    out = tmp_path_factory.mktemp("tokens")
    export_graphs(model, spec, out, opset=17, export_id="test")
    sessions = {name: ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
                for name in (ENCODER_FILE, DECODER_STEP_FILE)}
    return model, spec, sessions, out


def test_graphs_declare_symbolic_batch_and_lengths(exported):
    _, spec, _, out = exported
    for name, io in graph_io(spec).items():
        graph = onnx.load(str(out / name)).graph
        saved = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                 for v in [*graph.input, *graph.output]}
        assert saved == {**io["inputs"], **io["outputs"]}
    ops = {node.op_type for node in onnx.load(str(out / ENCODER_FILE)).graph.node}
    assert spec.cell.upper() in ops  # the native recurrent op with sequence_lens, not an unrolled loop


@pytest.mark.parametrize(("n", "length"), [(1, 1), (1, 6), (4, 7), (9, 3)])
def test_onnxruntime_equals_pytorch_step_by_step(exported, n, length):
    model, spec, sessions, _ = exported
    ids, lengths = batch(n, length, seed=n * 10 + length)
    io = graph_io(spec)
    state = dict(zip(io[ENCODER_FILE]["outputs"], sessions[ENCODER_FILE].run(
        None, {"source_ids": ids, "source_lengths": lengths})))
    with torch.no_grad():
        ref = model.encode(torch.from_numpy(ids), torch.from_numpy(lengths))
    valid = np.arange(length)[None, :] < lengths[:, None]  # (N, L): memory at padding is not compared
    for name, value in state.items():
        expected = ref[name].numpy()
        if name in ("memory", "keys", "values"):  # (N, L, D) or per head (N, heads, L, d_k)
            where = valid[..., None] if value.ndim == 3 else valid[:, None, :, None]
            value, expected = value * where, expected * where
        np.testing.assert_allclose(value, expected, atol=ATOL, err_msg=name)
    torch_state = (ref["hidden"], ref["cell"])
    previous = np.full(n, BOS_ID, dtype=np.int64)
    for _ in range(4):  # teacher-forced on PyTorch's own greedy choices
        feed = {name: state[name] for name in io[DECODER_STEP_FILE]["inputs"] if name != "previous_tokens"}
        outputs = dict(zip(io[DECODER_STEP_FILE]["outputs"], sessions[DECODER_STEP_FILE].run(
            None, {"previous_tokens": previous, **feed})))
        with torch.no_grad():
            log_probs, torch_state, alphas = model.decoder.step(torch.from_numpy(previous), torch_state, ref)
        np.testing.assert_allclose(outputs["log_probs"], log_probs.numpy(), atol=ATOL)
        if alphas is not None:
            np.testing.assert_allclose(outputs["alphas"], alphas.numpy(), atol=ATOL)
        state.update({FEEDBACK[k]: outputs[k] for k in FEEDBACK if k in outputs})
        previous = log_probs.argmax(-1).numpy()


def test_state_batch_axes_name_every_state_entry(exported):
    _, spec, _, _ = exported
    axes = state_batch_axes(spec)
    assert set(axes) == set(graph_io(spec)[DECODER_STEP_FILE]["inputs"]) - {"previous_tokens"}
    assert axes["hidden"] == 1 and all(axes[k] == 0 for k in ("keys", "memory", "source_mask") if k in axes)


# ---- decoding through the graphs: the same strategies drive PyTorch and onnxruntime -----------------------------

def runtime_steps(exported):
    """The exported graphs as a TokenSteps."""
    from runtime.token_steps import TokenSteps

    _, spec, sessions, _ = exported
    return TokenSteps(spec, sessions[ENCODER_FILE], sessions[DECODER_STEP_FILE])


@pytest.mark.parametrize(("n", "length"), [(1, 4), (5, 6)])
def test_greedy_tokens_equal_the_pytorch_reference(exported, n, length):
    from runtime.search import greedy_search
    from training.recurrent import EOS_ID

    model, spec, _, _ = exported
    ids, lengths = batch(n, length, seed=7 + n)
    steps = runtime_steps(exported)
    got = greedy_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, n, BOS_ID, EOS_ID, 8)
    reference = model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len=8)
    assert [h.tokens for h in got] == reference


@pytest.mark.parametrize(("n", "length"), [(1, 4), (4, 6)])
def test_beam_tokens_and_scores_equal_pytorch_driven_by_the_same_search(exported, n, length):
    from runtime.search import beam_search
    from training.recurrent import EOS_ID, torch_steps

    model, spec, _, _ = exported
    ids, lengths = batch(n, length, seed=11 + n)
    steps = runtime_steps(exported)
    options = dict(batch_size=n, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=4, num_hypotheses=3,
                   max_decoding_length=7)
    got = beam_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, **options)
    state, step = torch_steps(model, ids, lengths)
    want = beam_search(step, state, state_batch_axes(spec), **options)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    np.testing.assert_allclose([[h.score for h in hyps] for hyps in got],
                               [[h.score for h in hyps] for hyps in want], atol=1e-4)
