"""The explicit GRU cell equals nn.GRU (its first layer's input products looked up per token too), step graphs use
it; session defaults and CUDA device choice."""
from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import runtime.sessions as sessions
from export.cells import ExplicitGRU
from export.graphs import export_graphs
from runtime.contract import BEAM_STEP_FILE, DECODER_STEP_FILE, GREEDY_FILE
from runtime.defaults import DEFAULT_OPSET
from runtime.errors import InputError, ProviderError
from runtime.sessions import (
    ALLOW_SPINNING,
    DEFAULT_MAX_THREADS,
    max_threads,
    open_session,
)
from runtime.spec import ModelSpec
from training.build import build_token_model

import support.devices as devices
from support.devices import CUDA_UNAVAILABLE, DEVICES

# The same float32 arithmetic in another order (and fused kernels on PyTorch's side).
ATOL = 1e-5
RTOL = 1e-5
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RECURRENT_OPS = {"GRU", "LSTM", "RNN"}


@PROPERTY
@given(batch=st.integers(1, 9), inputs=st.integers(1, 12), hidden=st.integers(1, 12), layers=st.integers(1, 3),
       batch_first=st.booleans(), seed=st.integers(0, 2**16))
def test_explicit_gru_equals_torch_gru(batch: int, inputs: int, hidden: int, layers: int, batch_first: bool,
                                       seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rnn = nn.GRU(inputs, hidden, num_layers=layers, batch_first=batch_first).eval()
    x = torch.randn(batch, inputs, generator=gen)
    h = torch.randn(layers, batch, hidden, generator=gen)
    with torch.no_grad():
        out, want = rnn(x[:, None] if batch_first else x[None], h)
        top, got = ExplicitGRU(rnn)(x, h)
    torch.testing.assert_close(top, out[:, 0] if batch_first else out[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("rnn", [nn.GRU(3, 4, bidirectional=True), nn.GRU(3, 4, bias=False), nn.LSTM(3, 4)],
                         ids=repr)
def test_explicit_gru_refuses_what_it_cannot_compute(rnn: nn.Module) -> None:
    with pytest.raises(TypeError, match="ExplicitGRU needs a unidirectional nn.GRU with biases"):
        ExplicitGRU(rnn)


@PROPERTY
@given(batch=st.integers(1, 9), vocab=st.integers(1, 40), inputs=st.integers(1, 12), hidden=st.integers(1, 12),
       layers=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_explicit_gru_over_token_ids_equals_torch_gru_over_their_embeddings(batch: int, vocab: int, inputs: int,
                                                                           hidden: int, layers: int,
                                                                           seed: int) -> None:
    """With the embedding given, the first layer's input products come from tables of one row per token (made
    at construction) where they fit: the same step as nn.GRU over the embedded ids, with the tables or without."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    rnn = nn.GRU(inputs, hidden, num_layers=layers, batch_first=True).eval()
    embedding = nn.Embedding(vocab, inputs, padding_idx=0)
    ids = torch.randint(0, vocab, (batch,), generator=gen)
    h = torch.randn(layers, batch, hidden, generator=gen)
    assert ExplicitGRU(rnn, embedding).looked_up == (vocab * 3 * hidden <= (vocab + 3 * hidden) * inputs)
    with torch.no_grad():
        out, want = rnn(embedding(ids)[:, None], h)
        looked_up = ExplicitGRU(rnn, embedding, lookup=True)
        assert looked_up.table_rz.shape == (vocab, 2 * hidden) and looked_up.table_n.shape == (vocab, hidden)
        for cell in (looked_up, ExplicitGRU(rnn, embedding, lookup=False)):
            top, got = cell(ids, h)
            torch.testing.assert_close(top, out[:, 0], atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def input_products(path, spec: ModelSpec) -> dict[str, int]:
    """Per graph of a GRU token model's step: how many products read a weight as wide as the embedding (the first
    layer's input products, W_i x), and how many Gathers read a (vocabulary, 2 x hidden or hidden) table."""
    found = {}
    for name in (DECODER_STEP_FILE, GREEDY_FILE, BEAM_STEP_FILE):
        model = onnx.load(str(path / name))
        graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.type == a.GRAPH]
        nodes = [n for g in graphs for n in g.node]
        weights = {t.name: tuple(t.dims) for g in graphs for t in g.initializer}
        weights.update({n.output[0]: tuple(n.attribute[0].t.dims) for n in nodes if n.op_type == "Constant"})
        found[name] = {
            "products": sum(n.op_type in ("Gemm", "MatMul") and spec.embedding_dim in weights.get(n.input[1], ())
                            for n in nodes),
            "tables": sum(n.op_type == "Gather" and weights.get(n.input[0]) in
                          {(spec.target_vocab_size, 2 * spec.hidden_dim), (spec.target_vocab_size, spec.hidden_dim)}
                          for n in nodes)}
    return found


def gru_token_spec(layers: int, vocab: int, embedding_dim: int) -> ModelSpec:
    return ModelSpec(kind="tokens", cell="gru", layers=layers, attention="dot", hidden_dim=6,
                     embedding_dim=embedding_dim, source_vocab_size=vocab, target_vocab_size=vocab)


@pytest.mark.parametrize("layers", [1, 2])
def test_a_gru_token_step_looks_its_input_products_up(layers: int, tmp_path) -> None:
    """The step, greedy loop and beam step graphs run two Gathers for the first layer's input products instead of
    the embedding's Gather and two Gemms (tables of 11 x 18 values against 11 x 8 + 18 x 8 in the weights); the
    export's parity checks pass on them (export_graphs runs them)."""
    torch.manual_seed(0)
    spec = gru_token_spec(layers, vocab=11, embedding_dim=8)
    export_graphs(build_token_model(spec).eval(), spec, tmp_path, DEFAULT_OPSET, "test")
    assert set(map(str, input_products(tmp_path, spec).values())) == {str({"products": 0, "tables": 2})}


def test_tables_larger_than_the_weights_they_stand_in_for_are_not_made(tmp_path) -> None:
    """40 x 18 table values against 40 x 5 + 18 x 5 in the embedding and input weights: every step graph would
    grow by the tables (an int8 export most: its tables stay float32), so the products stay."""
    torch.manual_seed(0)
    spec = gru_token_spec(1, vocab=40, embedding_dim=5)
    export_graphs(build_token_model(spec).eval(), spec, tmp_path, DEFAULT_OPSET, "test")
    assert set(map(str, input_products(tmp_path, spec).values())) == {str({"products": 2, "tables": 0})}


def recurrent_ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path / DECODER_STEP_FILE)).graph.node} & RECURRENT_OPS


def test_point_step_graphs_have_no_recurrent_op(exports) -> None:
    for exported in exports.values():
        assert recurrent_ops(exported.path) == set(), exported.kind


def test_point_step_scores_are_not_divided(exports) -> None:
    """1/sqrt(d_k) is folded into the query projection: no Div is left for onnxruntime to fuse into FusedMatMul."""
    for kind in ("dot", "multihead"):
        ops = [node.op_type for node in onnx.load(str(exports[kind].path / DECODER_STEP_FILE)).graph.node]
        assert "Div" not in ops, kind


@pytest.mark.parametrize(("cell", "ops"), [("gru", set()), ("lstm", {"LSTM"})])
def test_token_step_graph_has_a_recurrent_op_for_lstm_only(cell: str, ops: set[str], tmp_path) -> None:
    torch.manual_seed(0)
    spec = ModelSpec(kind="tokens", cell=cell, layers=2, attention="dot", hidden_dim=6, embedding_dim=5,
                     source_vocab_size=11, target_vocab_size=11)
    export_graphs(build_token_model(spec).eval(), spec, tmp_path, DEFAULT_OPSET, "test")
    assert recurrent_ops(tmp_path) == ops


def identity_graph() -> bytes:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_session_defaults_are_applied() -> None:
    options = open_session(identity_graph(), "cpu", None, "identity").get_session_options()
    assert options.intra_op_num_threads == min(max_threads(), DEFAULT_MAX_THREADS) >= 1
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry(ALLOW_SPINNING) == "0"
    assert options.enable_cpu_mem_arena is True  # and off where asked: the small-call graphs (test_fast_graphs)
    assert open_session(identity_graph(), "cpu", 1, "identity", arena=False).get_session_options() \
        .enable_cpu_mem_arena is False


def test_explicit_threads_are_kept() -> None:
    options = open_session(identity_graph(), "cpu", 1, "identity").get_session_options()
    assert options.intra_op_num_threads == 1


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0", None])
def test_device_id_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(InputError, match=rf"device_id: expected an int from 0 to 2147483647 .* got {bad!r}"):
        open_session(identity_graph(), "cpu", 1, "identity", device_id=bad)


class FakeSession:
    """Records how a session was asked for; reports CUDA as running."""

    def __init__(self, data: bytes, sess_options: ort.SessionOptions, providers: list[str],
                 provider_options: list[dict], enable_fallback: int = 1) -> None:
        self.providers, self.provider_options = providers, provider_options
        self.arena = sess_options.enable_cpu_mem_arena
        self.fallback = enable_fallback

    def get_providers(self) -> list[str]:
        return self.providers


ORT_GPU_MAX_IR = 13  # onnxruntime-gpu 1.31.1, the newest GPU build on PyPI, refuses IR 14 (onnx 1.23's default)


def test_the_cuda_probe_uses_a_graph_the_gpu_build_reads_and_reports_a_fallback(monkeypatch) -> None:
    """On an H200 the probe's IR 14 graph raised, the probe swallowed it, and every CUDA row was skipped."""
    made, real = [], ort.InferenceSession

    def session(model: bytes, providers: list[str]) -> ort.InferenceSession:
        made.append(onnx.load_from_string(model))
        return real(model, providers=[sessions.CPU])  # what a GPU build with no GPU does

    monkeypatch.setattr(devices.ort, "get_available_providers", lambda: [sessions.CUDA, sessions.CPU])
    monkeypatch.setattr(devices.ort, "InferenceSession", session)
    assert devices.cuda_unavailable() == (f"a CUDA session of onnxruntime {ort.__version__} fell back to "
                                          f"['{sessions.CPU}']")
    assert [m.ir_version <= ORT_GPU_MAX_IR for m in made] == [True]


def test_cuda_gets_the_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions.ort, "get_available_providers", lambda: [sessions.CUDA, sessions.CPU])
    monkeypatch.setattr(sessions.ort, "InferenceSession", FakeSession)
    session = open_session(b"", "cuda", 1, "identity", device_id=3)
    assert session.providers == [sessions.CUDA, sessions.CPU]
    assert session.provider_options == [{"device_id": "3", "use_tf32": "0"}, {}]
    assert session.fallback == 0  # onnxruntime's own: a banner on stdout, and the same providers tried again
    # device 0 is onnxruntime's default; naming it made onnxruntime-gpu 1.31 warn at every session on an H200
    assert open_session(b"", "cuda", 1, "identity").provider_options == [{"use_tf32": "0"}, {}]
    # the arena stays on with CUDA: without it onnxruntime-gpu 1.31 ran the folded graphs wrong on an H200
    assert open_session(b"", "cuda", 1, "identity", arena=False).arena is True


@pytest.mark.skipif("cuda" not in DEVICES, reason=f"needs a working CUDA provider: {CUDA_UNAVAILABLE}")
def test_a_missing_gpu_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="CUDA device 4096"):
        open_session(identity_graph(), "cuda", 1, "identity", device_id=4096)
