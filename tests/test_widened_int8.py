"""An int8 transformer's graphs for few rows compute in float32 over their int8 weights (Net.widen) while no weight
matrix they quantize is past WIDEN_UP_TO values, the others (and past it, all) in int8 arithmetic
(DynamicQuantizeMatMul): which graphs are which, and that a widened graph computes exactly float32 arithmetic over the
int8 weights."""
from __future__ import annotations

import copy
import json
import re
import warnings
from collections import Counter
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import export.tokens.int8 as int8_module
from export.graph_nodes import subgraphs
from export.precision import WIDENED as WIDENED_WEIGHTS
from export.precision import quantized_ops
from export.quality_rows import QualityTolerance
from export.tokens.beam import beam_model
from export.tokens.fast import encoder_model, greedy_model, step_model
from export.tokens.int8 import int8_columns, widened_linear
from runtime.contract import MANIFEST_FILE
from runtime.model import Seq2Seq
from runtime.token_steps import WIDE_BEAM_INPUTS, WIDE_BEAM_INPUTS_INT8
from training.build import build_token_model

from support.models import export_token_model, toy_token_spec

WIDENED = {"fold_greedy": partial(greedy_model, fold=True), "fast_greedy": greedy_model,
           "fold_beam": partial(beam_model, fold=True), "fast_beam": beam_model, "fast_decoder_step": step_model,
           "fold_few_beam": partial(beam_model, fold=True, segments=True)}
QUANTIZED = {"wide_greedy": partial(greedy_model, wide=True), "wide_beam": partial(beam_model, wide=True),
             "wide_decoder_step": partial(step_model, wide=True), "fast_encoder": encoder_model}


@pytest.fixture(scope="module")
def toy():
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    torch.manual_seed(0)
    return build_token_model(spec).eval(), spec


def _nodes(g: onnx.GraphProto):
    """Every node of g and of its subgraphs (Loop bodies, If branches)."""
    for node in g.node:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)


def _widened_products(proto: onnx.ModelProto) -> int:
    """MatMul/Gemm nodes whose weight is Mul(Cast(an int8 initializer), scales): int8 weights widened in the graph."""
    nodes = list(_nodes(proto.graph))
    int8 = {t.name for g in [proto.graph] + [s for n in nodes for s in subgraphs(n)] for t in g.initializer
            if t.data_type == onnx.TensorProto.INT8}
    made = {out: n for n in nodes for out in n.output}

    def widened(name: str) -> bool:  # through a lifted weight's rank-one Add and an FFN's Concat (export.tokens.lift)
        node = made.get(name)
        while node is not None and node.op_type in ("Add", "Concat"):
            node = made.get(node.input[0])
        cast = node is not None and node.op_type == "Mul" and made.get(node.input[0])
        return bool(cast) and cast.op_type == "Cast" and cast.input[0] in int8
    return sum(n.op_type in ("MatMul", "Gemm") and widened(n.input[1]) for n in nodes)


def test_graphs_for_few_rows_widen_their_int8_weights_and_the_others_quantize_activations(toy):
    model, spec = toy
    for name, build in WIDENED.items():
        proto = build(model, spec, "", int8=True)
        ops = [n.op_type for n in _nodes(proto.graph)]
        # the decoder: per layer the self-attention's output projection and the FFN's two, then the output layer
        assert "DynamicQuantizeMatMul" not in ops and _widened_products(proto) >= 3 * spec.layers + 1, name
        assert quantized_ops(proto) == {WIDENED_WEIGHTS: _widened_products(proto)}, name  # the manifest's count
        assert _widened_products(build(model, spec, "")) == 0, name  # float32 exports store float32 weights
    for name, build in QUANTIZED.items():
        proto = build(model, spec, "", int8=True)
        assert "DynamicQuantizeMatMul" in [n.op_type for n in _nodes(proto.graph)], name
        assert _widened_products(proto) == 0, name


def test_a_model_with_a_matrix_past_widen_up_to_multiplies_in_int8_in_every_graph(toy, monkeypatch):
    """Past WIDEN_UP_TO values in some weight matrix (float32 weights past the caches cost more to read than a row
    costs to quantize: int8.widens), the graphs for few rows quantize activations as the wide ones do; at it, they
    widen."""
    model, spec = toy
    largest = max(2 * spec.d_model ** 2, spec.d_model * spec.d_ff, spec.d_model * spec.target_vocab_size)
    monkeypatch.setattr(int8_module, "WIDEN_UP_TO", largest - 1)
    for name, build in WIDENED.items():
        proto = build(model, spec, "", int8=True)
        assert "DynamicQuantizeMatMul" in [n.op_type for n in _nodes(proto.graph)], name
        assert _widened_products(proto) == 0, name
    monkeypatch.setattr(int8_module, "WIDEN_UP_TO", largest)
    assert all(_widened_products(build(model, spec, "", int8=True)) > 0 for build in WIDENED.values())


def test_the_folded_cross_attention_is_made_from_the_int8_rounded_weights_in_int8_arithmetic_too(toy, monkeypatch):
    """Past WIDEN_UP_TO, a folded graph's cross-attention matrices (made in float32 once a call) still come from the
    int8-rounded weights the other products multiply by, as widened; the manifest says which arithmetic it is."""
    model, spec = toy
    h, d, e = spec.n_heads, spec.head_dim, spec.d_model
    for bound in (0, int8_module.WIDEN_UP_TO):
        monkeypatch.setattr(int8_module, "WIDEN_UP_TO", bound)
        proto = greedy_model(model, spec, "", int8=True, fold=True)
        outs = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.dims == [h, d, e]]
        for layer in model.decoder_layers:
            rounded = widened_linear(layer.cross_attention.fc_attn).weight.detach().T.reshape(h, d, e).numpy()
            exact = layer.cross_attention.fc_attn.weight.detach().T.reshape(h, d, e).numpy()
            assert any(np.array_equal(o, rounded) for o in outs) and not any(np.array_equal(o, exact) for o in outs)


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def _rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of model whose every Linear weight is its int8 columns widened back to float32 (q * scale in float32,
    as onnxruntime folds the graph's Cast and Mul), but for the self-attentions' Q/K/V, which the Attention kernel
    reads in float32."""
    rounded = copy.deepcopy(model)
    for name, module in rounded.named_modules():
        if isinstance(module, torch.nn.Linear) and not re.search(r"(^|\.)(self_)?attention\.(queries|keys|values)$",
                                                                  name):
            q, scale = int8_columns(module.weight.detach().numpy().T)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy((q.astype(np.float32) * scale).T))
    return rounded


@pytest.mark.parametrize("name", ["fold_greedy", "fast_greedy", "fold_beam", "fast_beam", "fold_few_beam"])
def test_a_widened_graph_is_float32_arithmetic_over_the_int8_weights_bit_for_bit(toy, name):
    """Widened, an int8 graph decodes bit for bit as the float32 graph of the model with its weights rounded to
    those int8 weights (the output biases' shift and the folded cross-attention included), and not as the model's
    own float32 graph."""
    model, spec = toy
    build = WIDENED[name]
    rng = np.random.default_rng(3)
    feeds = {"source_ids": rng.integers(4, spec.source_vocab_size, (3, 7)), "source_lengths": np.array([7, 5, 2]),
             "max_length": np.array(6), "min_length": np.array(2), "beam_size": np.array(3),
             "num_hypotheses": np.array(2), "length_penalty": np.array(1.0)}
    widened, reference, float32 = (_run(p, feeds) for p in (build(model, spec, "", int8=True),
                                                            build(_rounded(model), spec, ""), build(model, spec, "")))
    for got, want in zip(widened, reference):
        np.testing.assert_array_equal(got, want)
    floats = [i for i, a in enumerate(widened) if a.dtype.kind == "f"]
    assert floats and any(not np.array_equal(widened[i], float32[i]) for i in floats)


def test_a_widened_graph_runs_the_float32_graphs_kernels(toy):
    """Widened, a graph is the float32 graph's nodes plus a Cast and a Mul per weight (folded as a session loads
    it): each attention's output bias moves into its values as in float32 (the shift solved against the widened
    weights), and the folded cross-attention's matrices are made from the widened weights."""
    model, spec = toy
    for name, build in WIDENED.items():
        widened, plain = build(model, spec, "", int8=True), build(model, spec, "")
        count = _widened_products(widened)
        ops = Counter(n.op_type for n in _nodes(widened.graph))
        ops.subtract({"Cast": count, "Mul": count})
        assert +ops == Counter(n.op_type for n in _nodes(plain.graph)), name


def test_an_int8_export_runs_the_wide_beam_graph_from_fewer_inputs(tmp_path, transformer_export):
    """int8's plain beam graph multiplies in float32 and its wide one in int8: the runtime switches at
    WIDE_BEAM_INPUTS_INT8 inputs, a float32 export at WIDE_BEAM_INPUTS."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=1, max_positions=32)
    loose = QualityTolerance(min_exact_match=0.0, min_token_agreement=0.0)  # untrained: only the switch matters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = export_token_model(spec, tmp_path / "int8", quantize="int8", quality_tol=loose).path
    assert "widened as a session loads them" in json.loads((int8 / MANIFEST_FILE).read_text())["precision"][
        "fast_graphs"]
    for path, threshold in ((int8, WIDE_BEAM_INPUTS_INT8), (transformer_export.path, WIDE_BEAM_INPUTS)):
        fast = Seq2Seq.load(path, provider="cpu").token_steps.fast
        assert fast.wide_beam_inputs == threshold
        picked = [fast.beam_graph(inputs, 4, 5) for inputs in (threshold - 1, threshold)]
        assert picked[0] is not fast.wide.beam and picked[1] is fast.wide.beam
    assert WIDE_BEAM_INPUTS_INT8 < WIDE_BEAM_INPUTS


def test_an_int8_export_past_widen_up_to_decodes_through_every_graph(tmp_path, monkeypatch):
    """Exported with its graphs for few rows in int8 arithmetic (as a model past WIDEN_UP_TO is), an int8 model
    passes export's checks (parity of the float32 graphs, then the int8 graphs' quality rows) and decodes through
    the graphs the runtime routes 1-5 inputs to, greedy and beam."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=1, max_positions=32)
    loose = QualityTolerance(min_exact_match=0.0, min_token_agreement=0.0)  # untrained: the ids may tie
    monkeypatch.setattr(int8_module, "WIDEN_UP_TO", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = export_token_model(spec, tmp_path / "int8", quantize="int8", quality_tol=loose).path
    for name in WIDENED:
        proto = onnx.load(path / f"{name}.onnx")
        assert _widened_products(proto) == 0 and "DynamicQuantizeMatMul" in [n.op_type for n in _nodes(proto.graph)]
    assert "in int8 too" in json.loads((path / MANIFEST_FILE).read_text())["precision"]["fast_graphs"]
    model = Seq2Seq.load(path, provider="cpu")
    texts = ["the cat sat", "a dog ran on the mat", "the bird", "a cat sat on the dog", "the mat flew"]
    for beam in (1, 3):
        for n in (1, 2, 5):
            got = model.translate_batch(texts[:n], beam_size=beam, max_decoding_length=6)
            assert len(got) == n and all(hyps and all(isinstance(t, int) for t in hyps[0].ids) for hyps in got)

