"""A point model's folded greedy loop (export.points.folded): the folds reproduce the model's step, the graph runs
fewer kernels a step than the traced loop and reads nothing per step from outside its body but the folded keys and
values, and its constant unit stays 1 however long it runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from export.fused import build_greedy_graph
from export.kinds import KINDS as EXPORT_KINDS
from export.points.folded import NAME, Folds
from runtime import Seq2Seq
from runtime.contract import GREEDY_FILE, greedy_io
from training.points.decode import encode, reference_decode

from support.models import make_model, source_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ATTENTION = ("dot", "multihead")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def folded_step(folds: Folds, v: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray],
                mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The body's arithmetic in float64: V (N, F + H + 1) -> V', attention weights (N, heads, L)."""
    h = v[:, folds.features:]  # h and its unit
    r, z = np.split(sigmoid(v @ folds.wrz.T), 2, axis=1)
    n = np.tanh(v @ folds.wxn.T + r * (h @ folds.whn.T))
    h = n + z * (h - n)
    share, weights = 0, []
    for head, (k, vals) in enumerate(zip(keys, values)):  # k (N, H, L), vals (N, L, H)
        masked = np.where(mask, folds.query_bias[head] @ k, -1e9)[:, 0]  # (N, L)
        scores = np.einsum("nh,nhl->nl", h[:, :-1], folds.query[head] @ k) + h[:, -1:] * masked
        alphas = np.exp(scores - scores.max(-1, keepdims=True))
        alphas /= alphas.sum(-1, keepdims=True)
        share = share + np.einsum("nl,nlf->nf", alphas, vals @ folds.value_share[head])
        weights.append(alphas)
    return np.concatenate([share, h], axis=1), np.stack(weights, axis=1)


@pytest.mark.parametrize("kind", ATTENTION)
def test_the_folds_reproduce_the_models_step_in_float64(kind):
    model, spec = make_model(kind)
    model = model.double()
    folds = Folds(model)
    source = torch.from_numpy(source_batch(4, 6, seed=5)).double()
    mask = torch.ones(4, 1, 6, dtype=torch.bool)
    mask[1, :, 3:] = mask[2, :, 1:] = False
    with torch.no_grad():
        states = encode(model, source, mask)
        x, hidden = states["decoder_input"], states["hidden"]
        keys_t, values = states["keys_t"].numpy(), states["values"].numpy()
        if kind == "dot":
            keys_t, values = keys_t[:, None], values[:, None]
        h0 = hidden[0].numpy()
        f = folds.features
        v = np.concatenate([x[:, 0].numpy() - h0 @ folds.x[:, f:-1].T - folds.x[:, -1], h0, np.ones((4, 1))], axis=1)
        for _ in range(6):
            v, weights = folded_step(folds, v, list(keys_t.transpose(1, 0, 2, 3)),
                                     list(values.transpose(1, 0, 2, 3)), mask.numpy())
            x, hidden, alphas = model.decoder.step(x, hidden, states["keys_t"], states["values"], mask)
            np.testing.assert_allclose(v @ folds.x.T, x[:, 0].numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(v[:, f:-1], hidden[0].numpy(), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(weights, alphas.numpy().reshape(weights.shape), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(v[:, -1], 1, atol=1e-12)  # the constant unit
            # n's input part through the point, as wide models take it, is the same product
            np.testing.assert_allclose(v @ folds.wxn.T, v @ folds.point.T @ folds.wn_point.T, rtol=1e-10, atol=1e-12)


def body_of(path: Path) -> onnx.GraphProto:
    """The body of the one Scan that runs the folded steps (export.scan_steps)."""
    nodes = onnx.load(str(path / GREEDY_FILE)).graph.node
    scans = [n for n in nodes if n.op_type == "Scan"]
    assert len(scans) == 1 and "Loop" not in {n.op_type for n in nodes}
    return next(a.g for a in scans[0].attribute if a.name == "body")


@pytest.mark.parametrize("kind", ATTENTION)
def test_the_body_reads_only_the_folded_keys_and_values_from_outside(exports, kind):
    """A Gemm whose weight the body reads from the outer graph is no constant to onnxruntime, which then packs it
    every step: the weights are the body's own."""
    body = body_of(exports[kind].path)
    own = {v.name for v in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}
    outside = {i for n in body.node for i in n.input if i and i not in own}
    reads = {"keys", "values_flat", "row_shape"} if kind == "multihead" else {"keys", "values_x"}
    assert outside == {NAME + name for name in reads}
    assert all(n.name.startswith(NAME) for n in body.node)


def kernels(model: onnx.ModelProto, tmp_path: Path) -> int:
    """Nodes of the Scan body after onnxruntime's optimizations (what runs a step)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    scan = next(n for n in optimized.graph.node if n.op_type == "Scan")
    return len(next(a.g for a in scan.attribute if a.name == "body").node)  # attributes in any order there


@pytest.mark.parametrize("kind, folded, traced", [("dot", 14, 21), ("multihead", 15, 23)])
def test_a_folded_step_runs_fewer_kernels_than_the_traced_one(exports, tmp_path, kind, folded, traced):
    exported = exports[kind]
    plain = build_greedy_graph(exported.path / "decoder_step.onnx", exported.spec, EXPORT_KINDS["points"].loop)
    assert kernels(onnx.load(str(exported.path / GREEDY_FILE)), tmp_path) == folded
    assert kernels(plain, tmp_path) == traced
    ops = [n.op_type for n in body_of(exported.path).node]
    assert ops.count("Gemm") == 2 and ops.count("MatMul") == 3 and "Where" not in ops and "Add" in ops


@pytest.mark.parametrize("kind", ATTENTION)
def test_the_constant_unit_stays_one_and_long_decodes_match_pytorch(exports, kind):
    exported = exports[kind]
    graph = onnx.load(str(exported.path / GREEDY_FILE))
    graph.graph.output.append(onnx.helper.make_tensor_value_info(NAME + "h_final", onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
    source = source_batch(5, 7, seed=9) * 4
    mask = np.ones((5, 1, 7), dtype=bool)
    mask[0, :, 3:] = mask[4, :, 1:] = False
    runtime = Seq2Seq.load(exported.path)
    feed = runtime.run_encoder({"source": source, "source_mask": mask}) | {"source_mask": mask}
    feed = {i.name: feed[i.name] for i in session.get_inputs() if i.name != "target_len"}
    outputs, alphas, h_final = session.run(None, {**feed, "target_len": np.array(400, np.int64)})
    np.testing.assert_allclose(h_final[:, -1], 1, atol=1e-6)
    want, want_alphas = reference_decode(exported.model, torch.from_numpy(source), 400, torch.from_numpy(mask))
    np.testing.assert_allclose(outputs, want.numpy(), atol=1e-4)
    np.testing.assert_allclose(alphas, want_alphas.numpy(), atol=1e-4)


@pytest.mark.parametrize("kind", ATTENTION)
@pytest.mark.parametrize("batch, steps", [(0, 0), (0, 3), (2, 0), (2, 3)])
def test_the_graph_called_directly_gives_the_declared_shapes_at_batch_and_length_0(exports, kind, batch, steps):
    """The runtime never runs a zero batch or length, but the graph is the contract's: (batch, decode_len, ...)."""
    exported = exports[kind]
    model = onnx.load(str(exported.path / GREEDY_FILE))
    declared = {**greedy_io(exported.spec)["inputs"], **greedy_io(exported.spec)["outputs"]}
    for value in [*model.graph.input, *model.graph.output]:
        assert [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim] == declared[value.name]
    sizes = {"batch": batch, "source_len": 4}
    feed = {name: np.zeros([sizes.get(d, d) for d in dims], np.float32) for name, dims in
            greedy_io(exported.spec)["inputs"].items() if name not in ("source_mask", "target_len")}
    feed["source_mask"] = np.ones((batch, 1, 4), dtype=bool)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs, alphas = session.run(None, {**feed, "target_len": np.array(steps, np.int64)})
    heads = (exported.spec.n_heads,) if kind == "multihead" else ()
    assert outputs.shape == (batch, steps, 2) and alphas.shape == (batch, *heads, steps, 4)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A seeded dot-attention point model at hidden 96, whose n gate goes through the point, exported."""
    from export.api import export_model
    from runtime.spec import ModelSpec
    from training.build import build_model

    torch.manual_seed(4)
    spec = ModelSpec(n_features=2, hidden_dim=96, attention="dot")
    model = build_model(spec).eval()
    return model, export_model(model, tmp_path_factory.mktemp("wide") / "dot96")


def test_a_wide_model_takes_n_through_the_point_and_decodes_as_the_step_loop(wide, exports):
    model, path = wide
    assert Folds(model).n_through_point and not Folds(exports["dot"].model).n_through_point
    names = [n.name for n in body_of(path).node]
    assert {NAME + "x_unit", NAME + "n_pre"} <= set(names) and [n.op_type for n in body_of(path).node].count("Gemm") == 3
    assert NAME + "wxn" not in {t.name for t in body_of(path).initializer}
    assert [o.name for o in body_of(path).output][2] == NAME + "x_unit"  # the loop scans [x; 1], not V
    source, mask = source_batch(4, 9, seed=2), np.ones((4, 1, 9), dtype=bool)
    mask[1, :, 5:] = False
    fused, steps = Seq2Seq.load(path), Seq2Seq.load(path, fused=False)
    got, got_alphas = fused.predict(source, 30, mask, return_attention=True)
    want, want_alphas = steps.predict(source, 30, mask, return_attention=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_alphas, want_alphas, rtol=1e-5, atol=1e-6)
