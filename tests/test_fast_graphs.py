"""A transformer's fast graphs (export.tokens.fast): written beside the traced ones, parity-checked at export, and
decoding exactly what the traced graphs decode, on both sides of the fused/wide switch
(runtime.token_steps.WIDE_ROWS)."""
from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import export.tokens.search as search_module
import runtime.optional_graphs as optional_graphs
from export.tokens.attention import Fused
from export.tokens.fast import BLOCKS_UP_TO, GROUP, eos_first
from export.tokens.fold import Folded, fold_cross
from export.tokens.kernels import FLOAT, INT32, MS, Net, cross_kv, tensor
from export.tokens.shift import value_shift
from runtime.contract import DECODER_STEP_FILE, FAST_FILES, MANIFEST_FILE
from runtime.errors import Cancelled, InputError, IntegrityError
from runtime.model import Seq2Seq
from runtime.optional_graphs import FOLD_UP_TO, fold_tokens, folds
from runtime.search import beam_search, greedy_search
from runtime.token_steps import FEW_BEAM_INPUTS, MAX_GRAPH_BEAM, WIDE_BEAM_INPUTS, WIDE_ROWS
from runtime.vocab import BOS, EOS
from training.build import build_token_model

from support.models import export_token_model, toy_token_spec

SCORE_RTOL = 1e-4
# ... and an absolute floor: a sum of float32 log-probs near 0 (a confident decode) differs by rounding only, ~1e-7
# a token (the greedy loop's log-softmax reads its columns in eos_first order, the traced graph in id order)
SCORE_ATOL = 2e-6
BEAM_RTOL = 1e-6  # the beam graph against the numpy search over the same step: float32 rounding only
VARIANTS = {"pre": dict(), "post-learned-tied": dict(norm="post", positional="learned", tie_embeddings=True,
                                                     layers=3, n_heads=4, input_len=FOLD_UP_TO)}  # not folded
TEXTS = ["the cat sat", "a dog ran", "the cat ran on the mat", "a bird flew", "the dog sat", "a cat",
         "the mat", "a dog sat on the cat", "the bird ran", "a mat flew"]


@pytest.fixture(scope="module", params=list(VARIANTS))
def fast_export(request, tmp_path_factory):
    fields = dict(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    spec = toy_token_spec(**{**fields, **VARIANTS[request.param]})
    return export_token_model(spec, tmp_path_factory.mktemp("fast") / "model")


def _texts(n: int) -> list[str]:
    return [TEXTS[i % len(TEXTS)] for i in range(n)]


def test_export_writes_every_fast_graph_and_checks_each_variant(fast_export):
    manifest = json.loads((fast_export.path / MANIFEST_FILE).read_text())
    spec = fast_export.model.spec
    folded = {FAST_FILES["fold_greedy"], FAST_FILES["fold_beam"], FAST_FILES["fold_few_beam"]}
    assert folds(spec) == (spec.n_heads * spec.input_len * spec.d_model <= FOLD_UP_TO)  # "pre" folds, the other not
    assert set(manifest["graphs"]) & set(FAST_FILES.values()) == set(FAST_FILES.values()) - (set() if folds(spec)
                                                                                             else folded)
    assert manifest["parity"]["passed"]
    text = json.dumps(manifest["parity"]["summary"])
    for prefix in ("fast.", "wide."):
        for output in ("step.log_probs", "sequence.log_probs", "greedy.ids", "greedy_loop.ids", "beam.ids",
                       "beam_graph.ids", "beam_graph.scores"):
            assert prefix + output in text
    fused = onnx.load(str(fast_export.path / FAST_FILES["step"]))
    traced = onnx.load(str(fast_export.path / DECODER_STEP_FILE))
    ops = {n.op_type for n in fused.graph.node}
    assert {"Attention", "MultiHeadAttention", "SkipLayerNormalization"} <= ops
    assert len(fused.graph.node) * 3 < len(traced.graph.node)  # the point of it: a third of the nodes, or fewer
    wide = {n.op_type for n in onnx.load(str(fast_export.path / FAST_FILES["wide_step"])).graph.node}
    assert not wide & {"Attention", "MultiHeadAttention", "SkipLayerNormalization"}
    for name in set(manifest["graphs"]) & set(FAST_FILES.values()):
        for value in onnx.load(str(fast_export.path / name)).graph.input:
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            assert "batch" in dims or dims == [], (name, value.name, dims)  # scalars: lengths and options
    for role in ("greedy", "beam"):  # the one-call graphs, folded (small models only) and plain: no If picks
        names = [FAST_FILES[f"fold_{role}"]] * folds(spec) + [FAST_FILES[role]]  # (an If cost ~2.6% a call)
        graphs = [onnx.load(str(fast_export.path / name)).graph.node for name in names]
        assert all("If" not in {n.op_type for n in nodes} for nodes in graphs), role
        loops = [[n for n in nodes if n.op_type == "Loop"] for nodes in graphs]
        assert [len(found) for found in loops] == [1] * len(loops), role  # one decode loop a graph, run once
        outer = [found[0].attribute[0].g.node for found in loops]  # folded first, then plain
        if role == "beam":  # fold_beam's and fast_beam's finishing work in an If a step
            assert all("If" in {n.op_type for n in nodes} for nodes in outer)
            for nodes in outer:
                _assert_a_step_in_blocks(nodes)
        bodies = [{n.op_type for n in nodes} for nodes in outer]  # the step's body
        assert ["MultiHeadAttention" in body for body in bodies] == [False] * folds(spec) + [True], role
        assert all("Attention" in body for body in bodies)
        wide = onnx.load(str(fast_export.path / FAST_FILES["wide_" + role])).graph.node
        assert [n.op_type for n in wide].count("Loop") == 1 and "If" not in {n.op_type for n in wide}, role
        if role == "greedy":  # the carried token is TopK's (rows, 1) index, read by GatherND: no Squeeze a step
            bodies.append({n.op_type for n in next(n for n in wide if n.op_type == "Loop").attribute[0].g.node})
            assert all("GatherND" in body and "Squeeze" not in body for body in bodies), bodies
            # eos is index 0 in the loop (eos_first): the stop test is Min, ReduceMax, Cast; no Equal, Or, Less
            assert all({"Min", "ReduceMax"} <= body and not body & {"Equal", "Or", "Less"} for body in bodies)
            # residuals as Add + LayerNormalization: onnxruntime's SkipLayerNormalization is slower in a loop body
            assert all("LayerNormalization" in body and "SkipLayerNormalization" not in body for body in bodies)
            assert eos_first(spec.target_vocab_size).tolist() == [EOS] + [i for i in range(spec.target_vocab_size)
                                                                          if i != EOS]
        if folds(spec):  # every folded body reads S with FusedMatMul's transB (S^T and a plain MatMul: no faster)
            assert "FusedMatMul" in bodies[0] and "Softmax" in bodies[0], (role, bodies[0])
    for name in set(manifest["graphs"]) & set(FAST_FILES.values()):  # every weight is read (onnxruntime warns of
        proto = onnx.load(str(fast_export.path / name))  # and drops the rest as a session loads the graph)
        graphs = list(_graphs(proto.graph))
        read = {i for g in graphs for n in g.node for i in n.input}
        assert not {w.name for g in graphs for w in g.initializer} - read, name
    if folds(spec):  # fold_few_beam's loop in segments: a Loop of runs of steps, no If anywhere
        nodes = onnx.load(str(fast_export.path / FAST_FILES["fold_few_beam"])).graph.node
        assert [n.op_type for n in nodes].count("Loop") == 1 and "If" not in {n.op_type for n in nodes}
        segment = next(n for n in nodes if n.op_type == "Loop").attribute[0].g.node
        assert [n.op_type for n in segment].count("Loop") == 1 and "If" not in {n.op_type for n in segment}
        steps = {n.op_type for n in next(n for n in segment if n.op_type == "Loop").attribute[0].g.node}
        # a run stops on its own test (no eos among the first k) or at its trip count: no If, Less, And or Not a step
        assert {"Attention", "FusedMatMul", "TopK"} <= steps and not {"If", "Less", "And", "Not"} & steps
        _assert_a_step_in_blocks(next(n for n in segment if n.op_type == "Loop").attribute[0].g.node)
    sessions = Seq2Seq.load(fast_export.path)._token_steps.fast  # the one-call graphs run without the CPU arena
    graphs = {"small": sessions, "wide": sessions.wide, **({"fold": sessions.folded} if folds(spec) else {})}
    arenas = {f"{name}_{kind}": getattr(found, kind)._run.session.get_session_options().enable_cpu_mem_arena
              for name, found in graphs.items() for kind in ("greedy", "beam", "few_beam") if hasattr(found, kind)}
    assert arenas == {"small_greedy": False, "small_beam": False, "wide_greedy": True, "wide_beam": True,
                      **({"fold_greedy": False, "fold_beam": False, "fold_few_beam": False} if folds(spec) else {})}
    assert (sessions.folded is not None) == folds(spec)


def _assert_a_step_in_blocks(nodes: list[onnx.NodeProto]) -> None:
    """A beam step over (B, k, ...) blocks keeps its values as select leaves them: the picked beams (B, k, 1) pick
    each input's histories and mask rows by GatherND (no flat row index: Add, Reshape), the kept sums are the next
    live ones (no Unsqueeze), and the sums leave eos's row out (no eos row read a step: search.finish adds it)."""
    kinds = [n.op_type for n in nodes]
    by_beam = [n for n in nodes if n.op_type == "GatherND" and any(a.name == "batch_dims" and a.i == 1
                                                                    for a in n.attribute)]
    assert len(by_beam) == 2 and "Unsqueeze" not in kinds, kinds
    assert not [i for n in nodes for i in n.input if i.startswith("eos_rows")], kinds


def test_the_runtime_sends_calls_small_enough_to_fold_to_the_folded_graphs(tmp_path, monkeypatch):
    """Folded graphs where inputs x heads x source_len x d_model <= FOLD_UP_TO, the plain ones past it: picked in
    Python per call (an If inside one graph picked the same at ~2.6% of a greedy batch-1 call)."""
    monkeypatch.setattr(optional_graphs, "FOLD_UP_TO", 2 * 16 * 5)  # 2 heads x d_model 16: 5 source tokens fold
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    exported = export_token_model(spec, tmp_path / "model")
    manifest = json.loads((exported.path / MANIFEST_FILE).read_text())
    assert manifest["parity"]["passed"]
    assert {"b1 s1", "b1 s7"} <= {c["case"] for c in manifest["parity"]["cases"]}  # one case either side
    fast, traced = Seq2Seq.load(exported.path), Seq2Seq.load(exported.path, fast=False)
    steps = fast.token_steps.fast
    for inputs, length, folded in ((1, 5, True), (1, 6, False), (2, 3, False), (5, 1, True)):
        assert (steps.greedy_loop(inputs, length) is steps.folded.greedy) == folded, (inputs, length)
        beam = steps.folded.few_beam if inputs <= FEW_BEAM_INPUTS else steps.folded.beam  # segments: 1-2 inputs
        assert (steps.beam_graph(inputs, length, 3) is beam) == folded, (inputs, length)
        assert steps.greedy_loop(inputs, length) is (steps.folded.greedy if folded else steps.greedy)
    calls = {"fold": 0, "plain": 0}
    for name, graph in (("fold", steps.folded.greedy), ("plain", steps.greedy), ("fold", steps.folded.few_beam),
                        ("plain", steps.beam)):
        def counted(*args, run=graph._run, name=name):
            calls[name] += 1
            return run(*args)
        monkeypatch.setattr(graph, "_run", counted)
    texts = ["a cat", "the cat ran on the mat", "a dog sat on the cat the mat", "the dog sat"]
    for options in (dict(), dict(beam_size=3, num_hypotheses=2)):
        for batch in ([texts[0]], [texts[2]], texts):  # short only (folded), long only, mixed (padded to long)
            got = [[h.ids for h in hyps] for hyps in fast.translate_batch(batch, **options)]
            assert got == [[h.ids for h in hyps] for hyps in traced.translate_batch(batch, **options)]
    assert calls == {"fold": 2, "plain": 4}  # "a cat" (+ eos: 3 tokens) folds, greedy and beam; the rest do not


@pytest.mark.parametrize("lifted", [False, True])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_folded_cross_attention_equals_multi_head_attention(rows, lifted):
    """Folded (S, bias, O made once) against MultiHeadAttention over the same keys/values, padding included, each
    reading the layer's own norm of the same stream; Folded's output holds fc_attn's bias (CROSS_BIAS), Fused's does
    not. Lifted (export.tokens.lift): S holds the bias, so the fold reads the norm with its beta lifted; not lifted,
    the plain norm and an Add a step."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=4, layers=2, max_positions=32)
    torch.manual_seed(0)
    model = build_token_model(spec)
    with torch.no_grad():  # trained-looking norms: a beta of its own
        for layer in model.decoder_layers:
            layer.res2.norm.bias.normal_(0.0, 0.05)
            layer.res2.norm.weight.uniform_(0.8, 1.2)
    h, d, e = spec.n_heads, spec.head_dim, spec.d_model
    net = Net(lifts=lifted)
    cross = fold_cross(net, model, spec, ["keys", "values"] * spec.layers, "lengths")
    assert (cross[1] == "") is lifted and (cross[4] == "") is lifted
    for i, layer in enumerate(model.decoder_layers):
        norm, up = layer.res2.norm, Folded.cross_lift(layer.res2.norm, cross[3 * i:3 * i + 3])
        assert (up is not None) is lifted
        x = net.one("LayerNormalization", ["z", net.weight("g", norm.weight), net.weight("b", norm.bias)],
                    axis=-1, epsilon=norm.eps)
        beta = norm.bias if up is None else norm.bias.double() + up.beta_add
        lifted_x = net.one("LayerNormalization", ["z", net.weight("g", norm.weight), net.weight("b", beta)],
                           axis=-1, epsilon=norm.eps)
        fused = Fused("lengths").cross_attention(net, spec, x, layer.cross_attention, ["keys", "values"])
        before = len(net.nodes)
        folded = Folded("lengths").cross_attention(net, spec, lifted_x, layer.cross_attention,
                                                   cross[3 * i:3 * i + 3])
        step = [node.op_type for node in net.nodes[before:]]  # what a decoder step runs
        assert step.count("Add") == (0 if lifted else 1) and len(step) == (5 if lifted else 6)
        net.op("Identity", [fused], [f"fused_{i}"])
        net.op("Identity", [folded], [f"folded_{i}"])
    outputs = [tensor(f"{kind}_{i}", FLOAT, None) for i in range(spec.layers) for kind in ("fused", "folded")]
    graph = onnx.helper.make_graph(net.nodes, "fold", [tensor("z", FLOAT, None), tensor("keys", FLOAT, None),
                                                       tensor("values", FLOAT, None), tensor("lengths", INT32, None)],
                                   outputs, initializer=net.weights)
    model_proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                               onnx.helper.make_opsetid(MS, 1)])
    model_proto.ir_version = 8
    session = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(rows)
    feed = {"z": (rng.normal(size=(3, rows, e)) * 3 + rng.normal(size=e)).astype(np.float32),
            "keys": rng.normal(size=(3, h, 7, d)).astype(np.float32),
            "values": rng.normal(size=(3, h, 7, d)).astype(np.float32),
            "lengths": np.array([7, 2, 5], np.int32)}  # padded keys: never read
    got = dict(zip([o.name for o in outputs], session.run(None, feed)))
    assert Folded.CROSS_BIAS and not Fused.CROSS_BIAS
    for i, layer in enumerate(model.decoder_layers):
        bias = layer.cross_attention.fc_attn.bias.detach().numpy()
        np.testing.assert_allclose(got[f"folded_{i}"], got[f"fused_{i}"] + bias, rtol=1e-5, atol=1e-5)
    feed["keys"][1, :, 2:] = 1e3  # what lies past an input's length changes nothing
    feed["values"][1, :, 2:] = -1e3
    again = dict(zip([o.name for o in outputs], session.run(None, feed)))
    np.testing.assert_allclose(again["folded_0"], got["folded_0"], rtol=1e-6, atol=1e-6)
    assert np.isfinite(again["folded_1"]).all()


def test_cross_kv_splits_every_layers_keys_and_values_heads_major_in_three_kernels():
    """export.tokens.kernels.cross_kv: one MatMul (+ bias Add) for every decoder layer, then one Reshape, one
    Transpose and one Split straight to (B, h, L, d) tensors (no per-tensor Transpose or Squeeze); each equals the
    layer's own MultiHeadAttention.project."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=4, layers=3, max_positions=32)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    net = Net(lifts=False)  # "memory" here is any tensor, not the encoder's lifted final norm (export.tokens.lift)
    parts = cross_kv(net, model, spec, "memory")
    assert [n.op_type for n in net.nodes] == ["MatMul", "Add", "Reshape", "Transpose", "Split"]
    graph = onnx.helper.make_graph(net.nodes, "kv", [tensor("memory", FLOAT, None)],
                                   [tensor(p, FLOAT, None) for p in parts], initializer=net.weights)
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    proto.ir_version = 8
    memory = np.random.default_rng(0).normal(size=(3, 7, spec.d_model)).astype(np.float32)
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                {"memory": memory})
    with torch.no_grad():
        want = [t.numpy() for layer in model.decoder_layers
                for t in layer.cross_attention.project(torch.from_numpy(memory))]
    assert [g.shape for g in got] == [(3, spec.n_heads, 7, spec.head_dim)] * 2 * spec.layers
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, WIDE_ROWS, WIDE_ROWS + 3])
@pytest.mark.parametrize("options", [dict(), dict(beam_size=3, num_hypotheses=2), dict(min_decoding_length=4),
                                     dict(sampling_topk=0, seed=7), dict(beam_size=2, length_penalty=0.5)],
                         ids=["greedy", "beam3", "min_len", "sampling", "beam2"])
def test_fast_graphs_decode_what_the_traced_graphs_decode(fast_export, rows, options):
    fast, traced = Seq2Seq.load(fast_export.path), Seq2Seq.load(fast_export.path, fast=False)
    assert fast.token_steps.fast is not None and traced.token_steps.fast is None
    texts = _texts(rows)
    got = fast.translate_batch(texts, max_decoding_length=12, **options)
    want = traced.translate_batch(texts, max_decoding_length=12, **options)
    assert [[h.ids for h in hyps] for hyps in got] == [[h.ids for h in hyps] for hyps in want]
    np.testing.assert_allclose([h.score for hyps in got for h in hyps], [h.score for hyps in want for h in hyps],
                               rtol=SCORE_RTOL, atol=SCORE_ATOL)


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_fused_and_wide_steps_agree_with_the_traced_step_at_every_step(fast_export, rows):
    runtime = Seq2Seq.load(fast_export.path)
    plain, fast = runtime.token_steps, runtime.token_steps.fast
    ids, lengths = runtime.vocabularies["source"].encode_batch(_texts(rows), add_eos=True)
    common = dict(batch_size=rows, bos_id=BOS, eos_id=EOS, max_decoding_length=10)
    want = greedy_search(plain.step, plain.encode(ids, lengths), plain.batch_axes, **common)
    for wide in (False, True):
        view = fast.only(wide)
        got = greedy_search(view.step, view.encode(ids, lengths), view.batch_axes, **common)
        assert [h.tokens for h in got] == [h.tokens for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=SCORE_RTOL, atol=SCORE_ATOL)
        beams = beam_search(view.step, view.encode(ids, lengths), view.batch_axes, beam_size=4, **common)
        plain_beams = beam_search(plain.step, plain.encode(ids, lengths), plain.batch_axes, beam_size=4, **common)
        assert [[h.tokens for h in b] for b in beams] == [[h.tokens for h in b] for b in plain_beams]


@pytest.fixture(scope="module")
def ending_export(tmp_path_factory):
    """A toy transformer whose rows end (emit eos) after 6 to 10 tokens, each at its own step: eos's logit raised
    by 1.0 through the model's own never-output constant (which the graphs carry)."""
    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=128)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    model.never_output[EOS] = 1.0
    return export_token_model(spec, tmp_path_factory.mktemp("ending") / "model", model=model)


@pytest.mark.parametrize("max_length", [12, BLOCKS_UP_TO], ids=["blocks", "one input a block"])
@pytest.mark.parametrize("min_length", [0, 8])
def test_the_wide_greedy_loop_decodes_every_batch_size_as_the_traced_step(ending_export, min_length, max_length):
    """The wide greedy loop reads blocks of GROUP inputs (one input a block where source_len + max_length passes
    BLOCKS_UP_TO) and pads the batch to a multiple of the block with inputs that ended from the start: every
    padding (1 to GROUP + 3 inputs), rows ending at different steps, the same tokens and scores as the traced step
    driven by the numpy greedy search."""
    runtime = Seq2Seq.load(ending_export.path)
    plain, wide = runtime.token_steps, runtime.token_steps.fast.only(wide=True)
    for rows in range(1, GROUP + 4):
        ids, lengths = runtime.vocabularies["source"].encode_batch(_texts(rows)[::-1], add_eos=True)
        want = greedy_search(plain.step, plain.encode(ids, lengths), plain.batch_axes, batch_size=rows, bos_id=BOS,
                             eos_id=EOS, max_decoding_length=max_length, min_decoding_length=min_length)
        got = wide.greedy_tokens(ids, lengths, max_length, min_length, False)
        assert [h.tokens for h in got] == [h.tokens for h in want], rows
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=SCORE_RTOL, atol=SCORE_ATOL)
    assert len({len(h.tokens) for h in got}) > 1 and max(len(h.tokens) for h in got) < 12  # rows end, not alike
    session = ort.InferenceSession(str(ending_export.path / FAST_FILES["wide_greedy"]))
    for rows in range(1, GROUP + 1):  # the padding inputs count as ended: the loop stops with the last real row
        ids, lengths = runtime.vocabularies["source"].encode_batch(_texts(rows), add_eos=True)
        tokens = session.run(["tokens"], {"source_ids": ids, "source_lengths": lengths,
                                          "max_length": np.array(30), "min_length": np.array(0)})[0]
        assert tokens.shape == (rows, max(len(h.tokens) for h in wide.greedy_tokens(ids, lengths, 30, 0, False)) + 1)


def test_attention_requests_decode_with_the_traced_graphs(fast_export):
    runtime = Seq2Seq.load(fast_export.path)
    with_attention = runtime.translate_batch(_texts(3), max_decoding_length=8, return_attention=True)
    without = runtime.translate_batch(_texts(3), max_decoding_length=8)
    assert all(h.attention is not None and h.attention.shape[0] == len(h.ids) for hyps in with_attention
               for h in hyps)
    assert [h[0].ids for h in with_attention] == [h[0].ids for h in without]


def test_fast_flag_is_checked_and_false_loads_no_fast_graph(fast_export):
    with pytest.raises(InputError, match="fast: expected True or False"):
        Seq2Seq.load(fast_export.path, fast="no")
    assert Seq2Seq.load(fast_export.path, fast=False).token_steps.fast is None
    without_loop = Seq2Seq.load(fast_export.path, fused=False).token_steps.fast
    assert without_loop is not None and without_loop.greedy is None and without_loop.wide[1] is None


def _without(export: Path, names: list[str], to: Path) -> Path:
    """A copy of `export` without the graph files `names` (in its manifest or not), as an older export was."""
    shutil.copytree(export, to)
    manifest = json.loads((to / MANIFEST_FILE).read_text())
    for name in names:
        manifest["graphs"].pop(name, None)
        (to / name).unlink(missing_ok=True)
    (to / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return to


@pytest.mark.parametrize("without", ["fast", "fold", "few"])
def test_an_export_without_fast_or_folded_graphs_still_loads_and_decodes(fast_export, tmp_path, without):
    """Exports made before the fast graphs, before the folded graphs had files of their own (their fast_greedy
    and fast_beam picked the body in an If), or before fold_few_beam."""
    names = {"fast": list(FAST_FILES.values()), "few": [FAST_FILES["fold_few_beam"]],
             "fold": [FAST_FILES[r] for r in ("fold_greedy", "fold_beam", "fold_few_beam")]}[without]
    runtime = Seq2Seq.load(_without(fast_export.path, names, tmp_path / "old"))
    assert (runtime.token_steps.fast is None) == (without == "fast")
    if without == "fold":
        steps = runtime.token_steps.fast
        assert steps.folded is None
        assert steps.greedy_loop(1, 1) is steps.greedy and steps.beam_graph(1, 1, 2) is steps.beam
    if without == "few" and folds(runtime.spec):
        steps = runtime.token_steps.fast
        assert steps.folded.few_beam is None and steps.beam_graph(1, 1, 2) is steps.folded.beam
    want = Seq2Seq.load(fast_export.path)
    for options in (dict(beam_size=2), dict()):
        assert [h[0].ids for h in runtime.translate_batch(_texts(2), max_decoding_length=8, **options)] == \
            [h[0].ids for h in want.translate_batch(_texts(2), max_decoding_length=8, **options)]


def test_an_altered_fast_graph_is_refused(fast_export, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(fast_export.path, bad)
    with open(bad / FAST_FILES["wide_greedy"], "ab") as f:
        f.write(b"\0")
    with pytest.raises(IntegrityError, match="wide_greedy.onnx"):
        Seq2Seq.load(bad)


@pytest.mark.parametrize("wide", [False, True], ids=["fused", "wide"])
def test_the_beam_graph_finds_what_the_numpy_beam_search_finds(fast_export, wide):
    """Random batches and options: the graph's n-best equals runtime.search.beam_search driven by the same
    variant's step: the same ids in the same order, scores and log-probs within float32 rounding (the graph's
    cross-attention reads an input's beams as one block)."""
    _check_beam_graphs(fast_export.path, wide, seed=int(wide))


@pytest.mark.parametrize("graph", ["beam", "fold_beam", "fold_few_beam", "wide_beam"])
def test_the_beam_graphs_decode_the_first_step_on_one_row_an_input_where_the_vocabulary_allows(
        fast_export, graph, tmp_path):
    """Every beam is bos at step 0 and all but the first start at -inf, so the block graphs' Loop starts from one
    row an input (live sums (B, 1, 1), a mask of one slot) and grows to k rows after step 0; a beam wider than the
    vocabulary starts from its k rows as before (the first step then has fewer than k candidates a row). Read off
    the Loop's first carried values, made graph outputs."""
    path = fast_export.path / FAST_FILES[graph]
    if not path.exists():
        pytest.skip(f"{graph} is not written for this variant")
    model = onnx.load(path)
    loop = next(node for node in model.graph.node if node.op_type == "Loop")
    live, ancestry = loop.input[4], loop.input[6]  # after max_length, cond: step, tokens, live, history, ancestry
    model.graph.output.extend([onnx.ValueInfoProto(name=live), onnx.ValueInfoProto(name=ancestry)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vocab = fast_export.model.spec.target_vocab_size
    ids = np.full((3, 4), 5, np.int64)
    for k, rows in ((1, 1), (4, 1), (vocab, 1), (vocab + 1, vocab + 1)):
        feed = dict(source_ids=ids, source_lengths=np.full(3, 4, np.int64), max_length=np.array(3, np.int64),
                    min_length=np.array(0, np.int64), beam_size=np.array(k, np.int64),
                    num_hypotheses=np.array(1, np.int64), length_penalty=np.array(1.0))
        first_live, first_mask = session.run([live, ancestry], feed)
        assert first_live.shape == (3, rows, 1) and first_mask.shape == (3, rows, rows), k
        assert first_live[:, 0].tolist() == [[0.0]] * 3 and np.isneginf(first_live[:, 1:]).all()


@pytest.fixture(scope="module")
def per_beam_export(tmp_path_factory):
    """The pre-norm model of fast_export, its beam graphs ranking each beam's best 2k first (search.select), as
    exports do from RANK_PER_BEAM_FROM target ids (the toy vocabulary has 14)."""
    before = search_module.RANK_PER_BEAM_FROM
    search_module.RANK_PER_BEAM_FROM = 1
    try:
        spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
        return export_token_model(spec, tmp_path_factory.mktemp("per_beam") / "model")
    finally:
        search_module.RANK_PER_BEAM_FROM = before


def _top_ks(path: Path) -> int:
    return sum(node.op_type == "TopK" for g in _graphs(onnx.load(path).graph) for node in g.node)


@pytest.mark.parametrize("wide", [False, True], ids=["fused", "wide"])
def test_ranking_each_beams_best_first_finds_what_the_numpy_beam_search_finds(per_beam_export, transformer_export,
                                                                            wide):
    """From RANK_PER_BEAM_FROM ids a step takes each beam's best 2k by a float32 TopK before the float64 ranking:
    the same n-best as the numpy search, as the graphs that rank all k V (one TopK more a step, where it runs)."""
    for name in ("fast_beam", "wide_beam", "fold_beam", "fold_few_beam"):
        assert _top_ks(per_beam_export.path / f"{name}.onnx") == _top_ks(transformer_export.path / f"{name}.onnx") + 1
    _check_beam_graphs(per_beam_export.path, wide, seed=7 + int(wide))


@pytest.fixture(scope="module")
def tied_export(tmp_path_factory):
    """fast_export's pre-norm model with its output layer zeroed: every target token but <pad> and <s> (-1e4) has
    the same log-prob at every step, so candidates tie everywhere, eos among them."""
    import torch

    from training.build import build_token_model

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    with torch.no_grad():
        model.output.weight.zero_()
        model.output.bias.zero_()
    return export_token_model(spec, tmp_path_factory.mktemp("tied") / "model", model=model)


@pytest.mark.parametrize("wide", [False, True], ids=["fused", "wide"])
def test_tied_candidates_and_beams_wider_than_the_vocabulary_find_what_the_numpy_search_finds(
        fast_export, tied_export, wide):
    """A step is calm (no finishing work) only where every eos sum of an input is below its k-th kept sum
    (search.select). Where an eos ties it, or where an input has fewer than k finite non-eos candidates (a beam
    wider than the vocabulary less eos: the k-th kept is -inf), the finishing work runs and ranks exactly: the same
    n-best as the numpy search."""
    vocab = fast_export.model.spec.target_vocab_size
    _check_beam_graphs(tied_export.path, wide, seed=11 + int(wide), beams=(1, 6))
    _check_beam_graphs(fast_export.path, wide, seed=13 + int(wide), beams=(vocab - 2, vocab + 6))


def _check_beam_graphs(path: Path, wide: bool, seed: int, beams: tuple[int, int] = (1, 5)) -> None:
    """12 random batches and options, beam sizes in `beams` (both ends included): each beam graph's n-best against
    the numpy search's."""
    fast = Seq2Seq.load(path).token_steps.fast.only(wide)
    vocab = Seq2Seq.load(path).vocabularies["source"]
    rng = np.random.default_rng(seed)
    for _ in range(12):
        rows = int(rng.integers(1, 5))
        k = int(rng.integers(beams[0], beams[1] + 1))
        options = dict(beam_size=k, num_hypotheses=int(rng.integers(1, k + 1)),
                       length_penalty=float(rng.choice([0.0, 0.5, 1.0, 2.0, -1.0])),
                       max_decoding_length=int(rng.integers(1, 14)))
        options["min_decoding_length"] = int(rng.integers(0, options["max_decoding_length"] + 1))
        ids, lengths = vocab.encode_batch(list(rng.choice(TEXTS, rows)), add_eos=True)
        want = beam_search(fast.step, fast.encode(ids, lengths), fast.batch_axes, batch_size=rows, bos_id=BOS,
                           eos_id=EOS, constant=fast.constant, **options)
        routed = fast.beam_graph(*ids.shape, k)  # the folded graph where the model folds; the plain one as well
        folded = [] if wide or fast.folded is None else [fast.folded.beam, fast.folded.few_beam]  # both loop shapes
        for graph in dict.fromkeys([routed] + ([] if wide else [fast.beam]) + folded):
            got = graph.hypotheses(ids, lengths, k, options["num_hypotheses"], options["length_penalty"],
                                   options["max_decoding_length"], options["min_decoding_length"])
            assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want], options
            np.testing.assert_allclose([(h.score, h.log_prob) for hyps in got for h in hyps],
                                       [(h.score, h.log_prob) for hyps in want for h in hyps], rtol=BEAM_RTOL,
                                       atol=0)


@pytest.mark.parametrize(("options", "message"), [
    (dict(beam_size=0), "beam_size must be an int in \\[1, 256\\]"),
    (dict(beam_size=257), "beam_size must be an int in \\[1, 256\\]"),
    (dict(beam_size=True), "beam_size must be an int in"),
    (dict(beam_size=2, num_hypotheses=3), "num_hypotheses must be at most beam_size \\(2\\), got 3"),
    (dict(beam_size=4, num_hypotheses=10**30), r"got 10{30}; pass at most 4, or a wider beam \(beam_size is at most "
                                                 r"256\)"),
    (dict(beam_size=2, length_penalty=60.0), "length_penalty must be from -50 to 50"),
    (dict(length_penalty=float("nan")), "length_penalty must be a finite float"),
    (dict(beam_size=2, min_decoding_length=9, max_decoding_length=4),
     "min_decoding_length 9 is more than max_decoding_length 4 .*pass at most 4"),
    (dict(beam_size=2.5), "beam_size must be an int in"),
    (dict(return_attention="yes"), "return_attention: expected True or False"),
])
@pytest.mark.parametrize("texts", [2, 0], ids=["texts", "no texts"])
def test_the_beam_graph_path_refuses_what_the_numpy_search_refuses(fast_export, options, message, texts):
    runtime = Seq2Seq.load(fast_export.path)
    assert runtime.token_steps.fast.beam is not None
    with pytest.raises(InputError, match=message):
        runtime.translate_batch(_texts(texts), **options)  # options are checked even when there is nothing to do


@pytest.mark.parametrize("options", [dict(beam_size=32), dict()], ids=["beam graph", "greedy graph"])
def test_a_one_call_graph_stops_while_it_runs_when_cancel_says_so(fast_export, options):
    """The watchdog terminates the run: cancel says stop from its second question on (the first is asked right
    before the run), and the decode ends with Cancelled long before it would have finished. Both are timed from
    that first question, so a pause before the run (the encoding of 4096 texts can meet a full garbage collection
    late in the suite: 0.33 s) does not count as the run's."""
    runtime = Seq2Seq.load(fast_export.path, threads=1)
    texts = _texts(64 if options else 4096)
    long = dict(min_decoding_length=32, max_decoding_length=32, **options)
    never: list[float] = []
    runtime.translate_batch(texts, cancel=lambda: never.append(time.monotonic()) and False, **long)
    whole = time.monotonic() - never[0]
    asked: list[float] = []
    with pytest.raises(Cancelled, match="cancelled by its caller while it ran"):
        runtime.translate_batch(texts, cancel=lambda: asked.append(time.monotonic()) or len(asked) > 1, **long)
    assert len(never) > 1 and time.monotonic() - asked[0] < whole / 2, (time.monotonic() - asked[0], whole)
    assert runtime.translate_batch(_texts(2), **options)  # the session is fine afterwards


@pytest.mark.parametrize("options", [dict(), dict(beam_size=3), dict(sampling_topk=0, seed=3)],
                         ids=["greedy", "beam", "sampling"])
def test_io_binding_decodes_the_fast_graphs_as_the_plain_runner_does(fast_export, options):
    """IO binding (on by default with CUDA; forced here on the CPU) keeps the fast step's fed-back cache bound."""
    bound, plain = Seq2Seq.load(fast_export.path, io_binding=True), Seq2Seq.load(fast_export.path)
    for rows in (1, WIDE_ROWS + 1):
        for fused in (True, False):
            got = Seq2Seq.load(fast_export.path, io_binding=True, fused=fused).translate_batch(
                _texts(rows), max_decoding_length=10, **options)
            want = plain.translate_batch(_texts(rows), max_decoding_length=10, **options)
            assert [[h.ids for h in hyps] for hyps in got] == [[h.ids for h in hyps] for hyps in want]
    assert bound.token_steps.fast is not None


def test_beam_search_runs_the_fast_beam_graph_below_wide_beam_inputs_and_the_wide_one_from_there(fast_export):
    """The fast beam graph's attention reads an input's beams as one block, so the switch to the wide one goes by
    inputs (WIDE_BEAM_INPUTS), not by rows as the step and greedy graphs' does; both find the same ids."""
    fast = Seq2Seq.load(fast_export.path).token_steps.fast
    long = fold_tokens(fast.spec) + 1  # sources too long to fold: the plain fast graph, not the folded one
    assert fast.beam_graph(WIDE_BEAM_INPUTS - 1, long, 5) is fast.beam
    assert fast.beam_graph(WIDE_BEAM_INPUTS, long, 5) is fast.wide.beam
    assert fast.only(wide=True).beam_graph(1, long, 5) is fast.wide.beam
    assert fast.only(wide=False).beam_graph(WIDE_BEAM_INPUTS, long, 5) is fast.beam
    # wider beams than MAX_GRAPH_BEAM run the step loop's search (its attention does not grow with the beam)
    assert fast.beam_graph(1, long, MAX_GRAPH_BEAM) is fast.beam
    assert fast.beam_graph(1, long, MAX_GRAPH_BEAM + 1) is None and fast.beam_graph(1, 1, MAX_GRAPH_BEAM + 1) is None
    assert (WIDE_BEAM_INPUTS - 1) * 5 >= WIDE_ROWS  # rows alone would have picked the wide graph
    if fast.folded is not None:  # calls that fold: fold_few_beam up to FEW_BEAM_INPUTS inputs, then fold_beam
        assert fast.beam_graph(1, 1, 5) is fast.folded.few_beam is not None
        assert fast.beam_graph(FEW_BEAM_INPUTS, 1, 5) is fast.folded.few_beam
        assert fast.beam_graph(FEW_BEAM_INPUTS + 1, 1, 5) is fast.folded.beam
    vocab = Seq2Seq.load(fast_export.path).vocabularies["source"]
    ids, lengths = vocab.encode_batch(_texts(WIDE_BEAM_INPUTS - 1), add_eos=True)
    found = [graph.hypotheses(ids, lengths, 5, 2, 1.0, 9, 0) for graph in (fast.beam, fast.wide.beam)]
    assert [[h.tokens for h in hyps] for hyps in found[0]] == [[h.tokens for h in hyps] for hyps in found[1]]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_int8_graphs_without_skip_norm_add_no_bias_after_a_quantized_matmul(norm):
    """Where a graph writes Add + Add + LayerNormalization (the wide beam and greedy graphs, the encoder), int8's
    DynamicQuantizeMatMul takes the projection's bias itself: no bias Add after one, in the graph or a Loop body."""
    from export.tokens.beam import beam_model
    from export.tokens.fast import encoder_model, greedy_model

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32, norm=norm)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    for proto in (beam_model(model, spec, "", wide=True, int8=True),
                  greedy_model(model, spec, "", wide=True, int8=True), encoder_model(model, spec, "", int8=True)):
        quantized, bias_adds = 0, []
        for g in _graphs(proto.graph):
            weights = {w.name for w in g.initializer}
            made = {o: n.op_type for n in g.node for o in n.output}
            quantized += sum(n.op_type == "DynamicQuantizeMatMul" for n in g.node)
            bias_adds += [n.name for n in g.node if n.op_type == "Add" and any(i in weights for i in n.input)
                          and any(made.get(i) == "DynamicQuantizeMatMul" for i in n.input)]
        assert quantized >= 3 * spec.layers and not bias_adds, bias_adds


def test_value_shift_moves_an_output_bias_into_the_values_or_declines():
    """c with c W^T = b: float32 gives the bias back; a singular, non-square, bias-free or far-from-orthogonal
    projection keeps its bias (None)."""
    torch.manual_seed(0)
    fc = torch.nn.Linear(16, 16)
    c = value_shift(fc)
    assert c is not None and torch.allclose(c @ fc.weight.detach().T, fc.bias.detach(), atol=1e-6)
    singular = torch.nn.Linear(16, 16)
    with torch.no_grad():
        singular.weight[3] = 0.0
    near = torch.nn.Linear(16, 16)
    with torch.no_grad():
        near.weight[3] = near.weight[4] * (1 + 1e-6)  # invertible in float64, c huge
    assert value_shift(singular) is None and value_shift(near) is None
    assert value_shift(torch.nn.Linear(16, 8)) is None and value_shift(torch.nn.Linear(16, 16, bias=False)) is None
    torch.manual_seed(1)
    wide = torch.nn.Linear(1024, 1024)
    with torch.no_grad():
        wide.bias.normal_(0, 0.1)  # |c| 8.75; float32 c W^T misses b by 1.12e-6: over 1e-6, within 4x its own
        # rounding (eps sqrt(E) |c| |W| = 1.04e-6)
    c = value_shift(wide)
    assert c is not None and torch.allclose(c @ wide.weight.detach().T, wide.bias.detach(), atol=1e-5)


def _graphs(g: onnx.GraphProto):
    from export.graph_nodes import subgraphs

    yield g
    for node in g.node:
        for sub in subgraphs(node):
            yield from _graphs(sub)


def _attention_bias_adds(proto: onnx.ModelProto, attentions: list) -> tuple[int, int]:
    """(MatMuls by one of `attentions`' output projections, bias Adds right after one) over a graph and its
    subgraphs."""
    weights = [m.fc_attn.weight.detach().T.numpy() for m in attentions]
    projections, bias_adds = 0, 0
    for g in _graphs(proto.graph):
        inits = {w.name: onnx.numpy_helper.to_array(w) for w in g.initializer}
        outs = {n.output[0] for n in g.node if n.op_type == "MatMul" and n.input[1] in inits
                and any(inits[n.input[1]].shape == w.shape and np.array_equal(inits[n.input[1]], w) for w in weights)}
        projections += len(outs)
        bias_adds += sum(n.op_type == "Add" and bool(outs & set(n.input)) and any(i in inits for i in n.input)
                         for n in g.node)
    return projections, bias_adds


def _decoder_attentions(model) -> list:
    return [m for layer in model.decoder_layers for m in (layer.self_attention, layer.cross_attention)]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_one_call_graphs_add_no_attention_output_bias_a_step(norm):
    """float32 one-call graphs move each decoder attention's output bias into its values (value_shift): no bias
    Add after an output projection in a Loop body; the encoder (once a call) keeps its biases, and so do the step
    graphs, whose caches the others read."""
    from export.tokens.beam import beam_model
    from export.tokens.fast import greedy_model, step_model

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32, norm=norm)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    encoder = [layer.attention for layer in model.encoder_layers]
    for build in (beam_model, partial(beam_model, wide=True), partial(beam_model, fold=True), greedy_model,
                  partial(greedy_model, wide=True), partial(greedy_model, fold=True)):
        proto = build(model, spec, "")
        projections, adds = _attention_bias_adds(proto, _decoder_attentions(model))
        assert projections >= 2 and adds == 0, (build, projections, adds)
        assert _attention_bias_adds(proto, encoder) == (2, 2), build
        for g in _graphs(proto.graph):  # nor an Add of zeros (the folded O's share of a bias the values took)
            zeros = {w.name for w in g.initializer if w.data_type == onnx.TensorProto.FLOAT
                     and not onnx.numpy_helper.to_array(w).any()}
            assert not [n.name for n in g.node if n.op_type == "Add" and zeros & set(n.input)], build
    assert _attention_bias_adds(step_model(model, spec, ""), _decoder_attentions(model)) == (4, 0)  # skip norm
    wide = step_model(model, spec, "", wide=True)  # 2-D rows: each output projection one Gemm with its own bias
    inits = {w.name: onnx.numpy_helper.to_array(w) for w in wide.graph.initializer}
    gemms = [(inits[n.input[1]], inits[n.input[2]]) for n in wide.graph.node if n.op_type == "Gemm"]
    for attention in _decoder_attentions(model):
        w, bias = attention.fc_attn.weight.detach().T.numpy(), attention.fc_attn.bias.detach().numpy()
        assert sum(np.array_equal(gw, w) and np.array_equal(gb, bias) for gw, gb in gemms) == 1


def test_a_projection_that_cannot_take_the_shift_keeps_its_bias_and_exports(tmp_path):
    """A singular output projection (no c) keeps its bias Add in the one-call graphs, which still pass export's
    parity checks and decode as the traced graphs."""
    from export.tokens.fast import greedy_model

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    with torch.no_grad():
        model.decoder_layers[0].self_attention.fc_attn.weight[0] = 0.0
    assert _attention_bias_adds(greedy_model(model, spec, "", fold=True), _decoder_attentions(model))[1] == 1
    exported = export_token_model(spec, tmp_path / "model", model=model)
    texts = _texts(3)
    fast = Seq2Seq.load(exported.path).translate_batch(texts, beam_size=1, max_decoding_length=8)
    traced = Seq2Seq.load(exported.path, fast=False).translate_batch(texts, beam_size=1, max_decoding_length=8)
    assert [h[0].ids for h in fast] == [h[0].ids for h in traced]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_wide_graphs_run_each_projection_with_a_bias_as_one_gemm(norm):
    """The wide greedy and beam bodies and the wide step graph read their rows as 2-D (Net.rows): every projection
    with a bias is one Gemm (onnxruntime fuses the FFN's Relu into it), and no bias Add follows a MatMul by a
    weight; int8 keeps DynamicQuantizeMatMul."""
    from export.tokens.beam import beam_model
    from export.tokens.fast import greedy_model, step_model

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32, norm=norm)
    torch.manual_seed(0)
    model = build_token_model(spec).eval()
    for build in (partial(beam_model, wide=True), partial(greedy_model, wide=True)):
        loop = next(n for n in build(model, spec, "").graph.node if n.op_type == "Loop")
        body = loop.attribute[0].g
        weights = {w.name for w in body.initializer}
        matmuls = {n.output[0] for n in body.node if n.op_type == "MatMul" and n.input[1] in weights}
        bias_adds = [n.name for n in body.node if n.op_type == "Add" and set(n.input) & matmuls
                     and set(n.input) & weights]
        gemms = [n for n in body.node if n.op_type == "Gemm"]
        # per layer: Q/K/V, the cross-attention's query, the FFN's two; then the output layer
        assert len(gemms) == 4 * spec.layers + 1 and not bias_adds, (build, len(gemms), bias_adds)
        assert all(len(n.input) == 3 and n.input[2] in weights for n in gemms)
        int8 = next(n for n in build(model, spec, "", int8=True).graph.node if n.op_type == "Loop")
        assert not any(n.op_type == "Gemm" for n in int8.attribute[0].g.node)
    step = step_model(model, spec, "", wide=True)  # the wide step graph reads (B, E) rows the same way
    weights = {w.name for w in step.graph.initializer}
    matmuls = {n.output[0] for n in step.graph.node if n.op_type == "MatMul" and n.input[1] in weights}
    assert not [n.name for n in step.graph.node if n.op_type == "Add" and set(n.input) & matmuls
                and set(n.input) & weights]
    assert sum(n.op_type == "Gemm" for n in step.graph.node) == 6 * spec.layers + 1  # with both output projections
