"""Token graphs: exported with symbolic batch/length, and onnxruntime equals PyTorch on padded batches of other
sizes, for GRU and LSTM, 1 and 2 layers, uni- and bidirectional, each attention kind, and for the transformer
(1 and 2 layers, pre and post norm, sinusoidal and learned positions, tied embeddings once): its cached step graph
equals the full-sequence decoder at every position, and takes only the new token and the cache."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.graphs import export_graphs
from runtime.contract import (
    BATCH,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FEEDBACK,
    GREEDY_FILE,
    SOURCE_LEN,
    graph_io,
    state_batch_axes,
)
from runtime.spec import ModelSpec
from training.build import build_token_model
from training.tokens.base import BOS_ID, PAD_ID, TokenModel

ATOL = 1e-5
CACHE_TEETH = 1e-3  # a step fed a wrong cache differs from the full-sequence decoder by far more than ATOL
VOCAB = 11
ATTENTION_CYCLE = ("dot", "additive", "none", "multihead")
# Every cell x layers x direction, each with one attention kind, cycling so every kind is covered by both cells.
COMBOS = [(cell, layers, bi, ATTENTION_CYCLE[i % len(ATTENTION_CYCLE)])
          for i, (cell, layers, bi) in enumerate(itertools.product(("gru", "lstm"), (1, 2), (False, True)))]
# Transformer rows (layers, norm, positional, tied, dropout): every option on both sides, cycled, not the full
# product. Dropout only acts in training: a model built with it must export and match in eval mode.
TRANSFORMERS = [(1, "pre", "sinusoidal", False, 0.0), (2, "post", "learned", False, 0.1),
                (1, "post", "sinusoidal", True, 0.0), (2, "pre", "learned", False, 0.3)]
MAX_POSITIONS = 16


def spec_for(cell: str, layers: int, bidirectional: bool, attention: str) -> ModelSpec:
    """A tiny token spec."""
    return ModelSpec(kind="tokens", cell=cell, layers=layers, bidirectional=bidirectional, attention=attention,
                     n_heads=2 if attention == "multihead" else 1, hidden_dim=6, embedding_dim=5, source_vocab_size=VOCAB, target_vocab_size=VOCAB)


def transformer_spec(layers: int, norm: str, positional: str, tied: bool, dropout: float = 0.0) -> ModelSpec:
    """A tiny transformer spec."""
    return ModelSpec(kind="tokens", arch="transformer", d_model=8, d_ff=12, n_heads=2, layers=layers, norm=norm,
                     positional=positional, tie_embeddings=tied, dropout=dropout, max_positions=MAX_POSITIONS,
                     source_vocab_size=VOCAB, target_vocab_size=VOCAB)


SPECS = {"-".join(map(str, c)): spec_for(*c) for c in COMBOS}
SPECS.update({"transformer-" + "-".join(map(str, t)): transformer_spec(*t) for t in TRANSFORMERS})
TRANSFORMER_IDS = [k for k in SPECS if k.startswith("transformer")]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def batch(n: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded random ids (n, length) and lengths (n,), the longest row shorter than `length` when n > 1."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, size=n)
    ids = rng.integers(4, VOCAB, size=(n, length))
    ids[np.arange(length)[None, :] >= lengths[:, None]] = PAD_ID
    return ids.astype(np.int64), lengths.astype(np.int64)


Exported = tuple[TokenModel, ModelSpec, dict[str, ort.InferenceSession], Path]
_EXPORTS: dict[str, Exported] = {}  # one export per row, shared by both fixtures below


def export_row(name: str, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """The row's seeded model exported (once), with its sessions."""
    if name not in _EXPORTS:
        spec = SPECS[name]
        torch.manual_seed(0)
        model = build_token_model(spec).eval()
        out = tmp_path_factory.mktemp("tokens")
        export_graphs(model, spec, out, opset=17, export_id="test")
        sessions = {file: ort.InferenceSession(str(out / file), providers=["CPUExecutionProvider"])
                    for file in (ENCODER_FILE, DECODER_STEP_FILE)}
        _EXPORTS[name] = model, spec, sessions, out
    return _EXPORTS[name]


@pytest.fixture(scope="module", params=list(SPECS))
def exported(request, tmp_path_factory) -> Exported:
    """Every row of the matrix, recurrent and transformer."""
    return export_row(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=TRANSFORMER_IDS)
def transformer(request, tmp_path_factory) -> Exported:
    """The transformer rows only."""
    return export_row(request.param, tmp_path_factory)


def run_graph(exported: Exported, file: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One graph's outputs by name."""
    _, spec, sessions, _ = exported
    return dict(zip(graph_io(spec)[file]["outputs"], sessions[file].run(None, feed)))


def test_graphs_declare_symbolic_batch_and_lengths(exported):
    _, spec, _, out = exported
    for name, io in graph_io(spec).items():
        graph = onnx.load(str(out / name)).graph
        saved = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                 for v in [*graph.input, *graph.output]}
        assert saved == {**io["inputs"], **io["outputs"]}
    ops = {node.op_type for node in onnx.load(str(out / ENCODER_FILE)).graph.node}
    if not spec.is_transformer:
        assert spec.cell.upper() in ops  # the native recurrent op with sequence_lens, not an unrolled loop
    else:
        assert not ops & {"GRU", "LSTM", "Loop", "Scan"}


@pytest.mark.parametrize(("n", "length"), [(1, 1), (1, 6), (4, 7), (9, 3)])
def test_onnxruntime_equals_pytorch_step_by_step(exported, n, length):
    model, spec, _, _ = exported
    ids, lengths = batch(n, length, seed=n * 10 + length)
    io = graph_io(spec)
    state = run_graph(exported, ENCODER_FILE, {"source_ids": ids, "source_lengths": lengths})
    with torch.no_grad():
        ref = model.encode(torch.from_numpy(ids), torch.from_numpy(lengths))
    valid = np.arange(length)[None, :] < lengths[:, None]  # (N, L): encoder states at padding are not compared
    for name, value in state.items():
        expected = ref[name].numpy()
        dims = io[ENCODER_FILE]["outputs"][name]
        if SOURCE_LEN in dims and value.dtype != bool:
            shape = [{BATCH: n, SOURCE_LEN: length}.get(d, 1) for d in dims]
            where = valid.reshape(shape)  # (N, L) spread over the entry's batch and source_len axes
            value, expected = value * where, expected * where
        np.testing.assert_allclose(value, expected, atol=ATOL, err_msg=name)
    torch_state = dict(ref)
    previous = np.full(n, BOS_ID, dtype=np.int64)
    for _ in range(4):  # teacher-forced on PyTorch's own greedy choices
        feed = {name: state[name] for name in io[DECODER_STEP_FILE]["inputs"] if name != "previous_tokens"}
        outputs = run_graph(exported, DECODER_STEP_FILE, {"previous_tokens": previous, **feed})
        with torch.no_grad():
            log_probs, torch_state, alphas = model.step(torch.from_numpy(previous), torch_state)
        np.testing.assert_allclose(outputs["log_probs"], log_probs.numpy(), atol=ATOL)
        if alphas is not None:
            np.testing.assert_allclose(outputs["alphas"], alphas.numpy(), atol=ATOL)
        for out, into in FEEDBACK.items():  # the fed-back state too: hidden, positions, the grown cache
            if out in outputs:
                np.testing.assert_allclose(outputs[out], torch_state[into].numpy(), atol=ATOL, err_msg=out)
        state.update({FEEDBACK[k]: outputs[k] for k in FEEDBACK if k in outputs})
        previous = log_probs.argmax(-1).numpy()


def test_state_batch_axes_name_every_state_entry(exported):
    _, spec, _, _ = exported
    axes = state_batch_axes(spec)
    assert set(axes) == set(graph_io(spec)[DECODER_STEP_FILE]["inputs"]) - {"previous_tokens"}
    layered = {"hidden", "cell", "past_keys", "past_values", "cross_keys", "cross_values"}  # (layers, N, ...)
    assert all(axes[k] == (1 if k in layered else 0) for k in axes), axes
    assert ("hidden" in axes) != spec.is_transformer and ("past_keys" in axes) == spec.is_transformer


# ---- decoding through the graphs: the same strategies drive PyTorch and onnxruntime -----------------------------

def runtime_steps(exported):
    """The exported graphs as a TokenSteps."""
    from runtime.binding import SessionRunner
    from runtime.contract import graph_io
    from runtime.token_steps import TokenSteps

    _, spec, sessions, _ = exported
    io = graph_io(spec)
    return TokenSteps(spec, *(SessionRunner(sessions[name], list(io[name]["outputs"]), name)
                              for name in (ENCODER_FILE, DECODER_STEP_FILE)))


@pytest.mark.parametrize(("n", "length"), [(1, 4), (5, 6)])
def test_greedy_tokens_equal_the_pytorch_reference(exported, n, length):
    from runtime.search import greedy_search
    from training.tokens.base import EOS_ID

    model, spec, _, _ = exported
    ids, lengths = batch(n, length, seed=7 + n)
    steps = runtime_steps(exported)
    got = greedy_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, n, BOS_ID, EOS_ID, 8)
    reference = model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len=8)
    assert [h.tokens for h in got] == reference


@pytest.mark.parametrize(("n", "length"), [(1, 4), (4, 6)])
def test_beam_tokens_and_scores_equal_pytorch_driven_by_the_same_search(exported, n, length):
    from runtime.search import beam_search
    from training.tokens.base import EOS_ID, torch_steps

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


# ---- the transformer's cache: the step graph is the full-sequence decoder, one position at a time ---------------

def target_ids(n: int, steps: int, seed: int) -> np.ndarray:
    """A fixed decoder input (n, steps): bos, then random non-special tokens."""
    ids = np.random.default_rng(seed).integers(4, VOCAB, size=(n, steps))
    ids[:, 0] = BOS_ID
    return ids.astype(np.int64)


@pytest.mark.parametrize(("n", "length", "steps"), [(1, 1, 5), (4, 7, 9), (9, 3, MAX_POSITIONS)])
def test_cached_step_equals_the_full_sequence_decoder_at_every_position(transformer, n, length, steps):
    model, spec, _, _ = transformer
    ids, lengths = batch(n, length, seed=n + length)
    target_in = target_ids(n, steps, seed=steps)
    with torch.no_grad():
        want = model.decode_sequence(model.encode(torch.from_numpy(ids), torch.from_numpy(lengths)),
                                     torch.from_numpy(target_in)).numpy()  # (N, T, V)
    state = run_graph(transformer, ENCODER_FILE, {"source_ids": ids, "source_lengths": lengths})
    inputs = [name for name in graph_io(spec)[DECODER_STEP_FILE]["inputs"] if name != "previous_tokens"]
    for t in range(steps):
        feed = {name: state[name] for name in inputs}
        outputs = run_graph(transformer, DECODER_STEP_FILE, {"previous_tokens": target_in[:, t], **feed})
        np.testing.assert_allclose(outputs["log_probs"], want[:, t], atol=ATOL, err_msg=f"position {t}")
        state.update({FEEDBACK[k]: outputs[k] for k in FEEDBACK if k in outputs})
    # The check has teeth: the last step fed a zeroed cache is far from the full-sequence decoder.
    if steps > 1:
        wrong = {**feed, **{k: np.zeros_like(feed[k]) for k in ("past_keys", "past_values")}}
        outputs = run_graph(transformer, DECODER_STEP_FILE, {"previous_tokens": target_in[:, -1], **wrong})
        assert np.abs(outputs["log_probs"] - want[:, -1]).max() > CACHE_TEETH


def test_the_empty_first_step_reads_position_zero_and_starts_the_cache(transformer):
    model, spec, _, _ = transformer
    ids, lengths = batch(3, 5, seed=3)
    state = run_graph(transformer, ENCODER_FILE, {"source_ids": ids, "source_lengths": lengths})
    assert state["past_keys"].shape == (spec.layers, 3, spec.n_heads, 0, spec.head_dim)
    assert state["past_values"].shape == state["past_keys"].shape and state["positions"].tolist() == [0, 0, 0]
    feed = {name: state[name] for name in graph_io(spec)[DECODER_STEP_FILE]["inputs"] if name != "previous_tokens"}
    outputs = run_graph(transformer, DECODER_STEP_FILE, {"previous_tokens": np.full(3, BOS_ID), **feed})
    assert outputs["present_keys"].shape == (spec.layers, 3, spec.n_heads, 1, spec.head_dim)
    assert outputs["next_positions"].tolist() == [1, 1, 1]
    with torch.no_grad():
        want = model.decode_sequence(model.encode(torch.from_numpy(ids), torch.from_numpy(lengths)),
                                     torch.full((3, 1), BOS_ID))
    np.testing.assert_allclose(outputs["log_probs"], want[:, 0].numpy(), atol=ATOL)
    np.testing.assert_allclose(outputs["alphas"].sum(axis=1), 1.0, atol=ATOL)  # (N, Ls): a distribution per row
    assert (outputs["alphas"][np.arange(5)[None, :] >= lengths[:, None]] == 0).all()  # none on padding


@pytest.mark.parametrize("past_len", [0, 1, 7])
def test_the_step_graph_takes_only_the_new_token_and_the_cache(transformer, past_len):
    """O(t) per step: the inputs are exactly the contract's (one token per row, no earlier tokens), the cache grows
    by one, and the earlier entries are carried over as given, not recomputed."""
    _, spec, _, out = transformer
    declared = graph_io(spec)[DECODER_STEP_FILE]["inputs"]
    graph = onnx.load(str(out / DECODER_STEP_FILE)).graph
    assert [v.name for v in graph.input] == list(declared) and declared["previous_tokens"] == [BATCH]
    n, length = 2, 4
    ids, lengths = batch(n, length, seed=past_len)
    state = run_graph(transformer, ENCODER_FILE, {"source_ids": ids, "source_lengths": lengths})
    rng = np.random.default_rng(past_len)
    cache = (spec.layers, n, spec.n_heads, past_len, spec.head_dim)
    past = {k: rng.normal(size=cache).astype(np.float32) for k in ("past_keys", "past_values")}
    feed = {**{name: state[name] for name in declared if name in state}, **past,
            "positions": np.full(n, past_len, dtype=np.int64), "previous_tokens": np.array([5, 6])}
    outputs = run_graph(transformer, DECODER_STEP_FILE, feed)
    for name in ("keys", "values"):
        present = outputs[f"present_{name}"]
        assert present.shape == (spec.layers, n, spec.n_heads, past_len + 1, spec.head_dim)
        np.testing.assert_array_equal(present[:, :, :, :past_len], past[f"past_{name}"])
    assert outputs["next_positions"].tolist() == [past_len + 1] * n


def test_a_position_table_shorter_than_the_export_examples_is_refused(tmp_path):
    from export.errors import ExportError
    from export.examples import MIN_EXPORT_POSITIONS

    spec = dataclasses.replace(transformer_spec(1, "pre", "learned", False), max_positions=MIN_EXPORT_POSITIONS - 1)
    with pytest.raises(ExportError, match=f"'max_positions' is {MIN_EXPORT_POSITIONS - 1}: .* needs max_positions "
                                          f">= {MIN_EXPORT_POSITIONS}"):
        export_graphs(build_token_model(spec).eval(), spec, tmp_path, opset=17, export_id="test")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("n", "length"), [(1, 4), (4, 6)])
def test_the_greedy_loop_graph_equals_pytorch_and_carries_a_one_layer_gru_state_narrow(exported, n, length):
    """The greedy loop graph decodes what PyTorch decodes; where the step reads its hidden state only as hidden[0]
    and writes it back unsqueezed (a one-layer GRU), the loop carries the (N, H) state itself and the two nodes
    leave its body (export.fused.squeeze_carried)."""
    from training.tokens.base import EOS_ID

    model, spec, _, path = exported
    ids, lengths = batch(n, length, seed=11 + n)
    steps = runtime_steps(exported)
    loop = onnx.load(str(path / GREEDY_FILE))
    narrowed = [node for node in loop.graph.node if node.output[0].endswith("_narrow")]
    assert len(narrowed) == (spec.cell == "gru" and spec.layers == 1 and not spec.is_transformer)
    session = ort.InferenceSession(str(path / GREEDY_FILE), providers=["CPUExecutionProvider"])
    state = steps.encode(ids, lengths)
    feed = {i.name: state[i.name] if i.name in state else np.array(8 if i.name == "max_length" else 0)
            for i in session.get_inputs()}
    tokens = session.run(["tokens"], feed)[0].tolist()
    got = [row[:row.index(EOS_ID)] if EOS_ID in row else row for row in tokens]
    assert got == model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len=8)


def test_tolerances_as_large_as_a_float64_holds_judge_without_a_numpy_warning(tmp_path):
    """`export --atol 1e300 --rtol 1e300` passed, but printed numpy's 'RuntimeWarning: overflow encountered in cast'
    and its source line (the token step's log-probs compared in float32; found by a fresh walk)."""
    import warnings

    from export.parity import Tolerance

    from support.models import export_token_model, toy_token_spec

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        export_token_model(toy_token_spec(hidden_dim=8, embedding_dim=6), tmp_path / "m",
                           tol=Tolerance(atol=1e300, rtol=1e300, drift_atol=1e300))
