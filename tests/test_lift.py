"""A pre-norm decoder's biases ride on its LayerNorms (export.tokens.lift): the lifted norm's output reads 1 along
its direction, the products after it carry their biases, and the graphs that use it decode as without it, with
fewer kernels a step."""
from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import export.tokens.kernels as kernels
from export.graph_nodes import subgraphs
from export.tokens.beam import beam_model
from export.tokens.fast import encoder_model, greedy_model, step_model
from export.tokens.lift import LIFT_MAX_DIRECTION, LIFT_MIN_GAMMA, lift, rank_one
from training.build import build_token_model

from support.models import toy_token_spec

GRAPHS = {"fold_greedy": partial(greedy_model, fold=True), "fast_greedy": greedy_model,
          "fold_beam": partial(beam_model, fold=True), "fast_beam": beam_model,
          "fold_few_beam": partial(beam_model, fold=True, segments=True)}
# Adds a step the lifts take out, per lifted decoder layer and once: the folded cross-attention's score bias (folded
# graphs only), the FFN's two biases; the output layer's bias
SAVED = {"fold_greedy": (3, 1), "fast_greedy": (2, 1), "fold_beam": (3, 1), "fast_beam": (2, 1),
         "fold_few_beam": (3, 1)}


def _norm(size: int, seed: int, beta_sign: float) -> torch.nn.LayerNorm:
    torch.manual_seed(seed)
    norm = torch.nn.LayerNorm(size)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_(0.0, 0.3).abs_().mul_(beta_sign)  # sum(beta / g) of that sign: either s
    return norm


@pytest.mark.parametrize("beta_sign", [1.0, -1.0])
def test_a_lifted_norm_reads_one_along_its_direction_and_a_product_after_it_carries_its_bias(beta_sign):
    norm = _norm(48, 1, beta_sign)
    up = lift(norm)
    g, beta = norm.weight.detach().double(), norm.bias.detach().double()
    kappa = float((beta / g).sum()) + float(up.beta_add[0] / g[0]) * 48
    assert abs(kappa) >= 48 and np.sign(kappa) == beta_sign  # |kappa| >= E: the constant keeps its precision
    x = torch.randn(500, 48, dtype=torch.float64) * 4 + torch.randn(48, dtype=torch.float64)
    y = torch.nn.functional.layer_norm(x, (48,), g, beta, norm.eps)
    lifted = torch.nn.functional.layer_norm(x, (48,), g, beta + up.beta_add, norm.eps)
    np.testing.assert_allclose((lifted @ up.direction).numpy(), 1.0, rtol=0, atol=1e-12)
    w, b = torch.randn(48, 30, dtype=torch.float64), torch.randn(30, dtype=torch.float64)
    u, c = rank_one(w, b, up)
    np.testing.assert_allclose((lifted @ (w + u * c)).numpy(), (y @ w + b).numpy(), rtol=0, atol=1e-10)


def test_a_norm_that_cannot_be_lifted_is_left():
    norm = _norm(16, 2, 1.0)
    with torch.no_grad():
        norm.weight[3] = LIFT_MIN_GAMMA * float(norm.weight.abs().max()) / 2  # 1 / g would blow up the rank-one term
    assert lift(norm) is None
    assert lift(torch.nn.LayerNorm(16, elementwise_affine=False)) is None
    assert lift(torch.nn.LayerNorm(16, bias=False)) is None
    assert lift(torch.nn.Identity()) is None
    assert lift(_norm(16, 2, 1.0)) is not None
    tiny = _norm(16, 2, 1.0)  # every gain tiny: the ratio test passes, but |u| = 1 / (|g| |kappa|) is ~1e9, where
    with torch.no_grad():  # FAR u overflowed float32 in a folded graph (its outputs were not finite)
        tiny.weight.mul_(1e-10)
        tiny.bias.mul_(1e-10)
    assert float((1.0 / tiny.weight.detach().double()).abs().max()) / 16 / 2 > LIFT_MAX_DIRECTION
    assert lift(tiny) is None


def _decoder_ops(proto, tmp_path, outer: bool = False) -> Counter:
    """The kernels of the graph's Loop body (a step: in fold_few_beam, the body of its segments' Loop), or of the graph
    itself (a step graph; outer: the graph around the Loop, the encoder's among them), as a session runs them:
    constants folded (a lifted weight's rank-one Add among them), no other rewrite."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    for _ in range(0 if outer else 2):  # into the Loop's body, and a segment's into its steps' (fold_few_beam)
        loops = [n for n in graph.node if n.op_type == "Loop"]
        graph = subgraphs(loops[0])[0] if loops else graph
    return Counter(n.op_type for n in graph.node)


def _run(proto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def _trained_looking(mixed: bool = False):
    """A pre-norm toy transformer whose norms have betas and gains of their own, as a trained model's do; mixed: its
    first decoder layer's norms before the cross-attention and the FFN each with a gain of 0 (not lifted)."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=4, layers=2, max_positions=32)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.7, 1.3)
                module.bias.normal_(0.0, 0.1)
        if mixed:
            model.decoder_layers[0].res2.norm.weight[5] = 0.0
            model.decoder_layers[0].res3.norm.weight[7] = 0.0
    return model, spec


@pytest.fixture(scope="module")
def trained_looking():
    return _trained_looking()


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_lifted_graphs_decode_as_unlifted_ones_with_fewer_adds_a_step(monkeypatch, tmp_path, name, int8, mixed):
    """Every lifted norm takes its Adds out (mixed: the first layer's norms are not lifted, the second's are); the
    decode is the unlifted graph's, padded sources included (the fold's padding, FAR u or -inf)."""
    model, spec = _trained_looking(mixed)
    build = GRAPHS[name]
    lifted = build(model, spec, "", int8=int8)
    monkeypatch.setattr(kernels, "LIFTS", False)
    plain = build(model, spec, "", int8=int8)
    per_layer, once = SAVED[name]
    ops, plain_ops = _decoder_ops(lifted, tmp_path), _decoder_ops(plain, tmp_path)
    assert plain_ops["Add"] - ops["Add"] == per_layer * (spec.layers - mixed) + once
    # once a call: each encoder layer's FFN biases, and the cross-attention keys' and values' (on the lifted memory)
    assert _decoder_ops(plain, tmp_path, True)["Add"] - _decoder_ops(lifted, tmp_path, True)["Add"] == \
        2 * spec.layers + 1
    rng = np.random.default_rng(5)
    feeds = {"source_ids": rng.integers(4, spec.source_vocab_size, (3, 7)), "source_lengths": np.array([7, 5, 2]),
             "max_length": np.array(8), "min_length": np.array(2), "beam_size": np.array(3),
             "num_hypotheses": np.array(2), "length_penalty": np.array(1.0)}  # padded sources: the fold's mask
    for got, want in zip(_run(lifted, feeds), _run(plain, feeds)):
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(got, want)


def test_a_step_graph_lifts_its_ffn_but_not_its_output_layer_and_a_post_norm_stack_nothing(trained_looking,
                                                                                          monkeypatch, tmp_path):
    """A step graph's every log-prob leaves it: its output layer keeps its bias, so the never-output ids (-1e4)
    read as unlifted (within float32's step at 1e4), where lifted they would carry the rank-one term's rounding."""
    model, spec = trained_looking
    lifted, lifted_encoder = step_model(model, spec, ""), encoder_model(model, spec, "")
    post_spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=4, layers=2, max_positions=32,
                               norm="post")
    post = build_token_model(post_spec).eval()
    post_lifted = greedy_model(post, post_spec, "", fold=True)
    monkeypatch.setattr(kernels, "LIFTS", False)
    plain = step_model(model, spec, "")
    # the FFN's first bias (its SkipLayerNormalization takes the FFN's second either way)
    assert _decoder_ops(plain, tmp_path)["Add"] - _decoder_ops(lifted, tmp_path)["Add"] == spec.layers
    encoder = encoder_model(model, spec, "")
    # the encoder graph: each layer's FFN biases and the cross keys' and values' ride on lifted norms
    assert _decoder_ops(encoder, tmp_path)["Add"] - _decoder_ops(lifted_encoder, tmp_path)["Add"] == 2 * spec.layers + 1
    rng = np.random.default_rng(2)
    feeds = {"source_ids": rng.integers(4, spec.source_vocab_size, (4, 6)), "source_lengths": np.array([6, 3, 5, 1])}
    state = dict(zip([o.name for o in encoder.graph.output], _run(encoder, feeds)))
    for got, want in zip(_run(lifted_encoder, feeds), state.values()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    state["previous_tokens"] = rng.integers(4, spec.target_vocab_size, 4)  # the first step after the encoder
    got, want = _run(lifted, state)[0], _run(plain, state)[0]
    never = want < -1000
    assert never.any() and np.abs(got - want)[never].max() <= 1e-3
    np.testing.assert_allclose(got[~never], want[~never], rtol=1e-5, atol=1e-5)
    post_ops = _decoder_ops(greedy_model(post, post_spec, "", fold=True), tmp_path)
    assert post_ops == _decoder_ops(post_lifted, tmp_path)
