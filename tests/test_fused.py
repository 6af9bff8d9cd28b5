"""The greedy loop graph (greedy_loop.onnx): the same results as the step loop, one call per request."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runtime import Seq2Seq
from runtime.contract import DECODE_LEN, GREEDY_FILE, MANIFEST_FILE, greedy_io
from runtime.errors import InputError, ManifestError
from runtime.vocab import EOS

from support.models import export_token_model, source_batch, toy_token_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# eos's output row scaled and its bias moved, so that these seeded untrained models end some rows early (at
# different steps) and run others to the end: (weight scale, bias offset) per model
EOS_LOGIT = {"lstm": (10.0, 0.25), "transformer": (10.0, -1.0)}


def both(path: Path) -> tuple[Seq2Seq, Seq2Seq]:
    """The same export with the greedy loop graph and with the step loop."""
    fused, steps = Seq2Seq.load(path, provider="cpu"), Seq2Seq.load(path, provider="cpu", fused=False)
    assert fused.has_fused and not steps.has_fused
    return fused, steps


@pytest.mark.parametrize("target_len", [1, 2, 17])
def test_points_greedy_loop_equals_the_step_loop(exported, target_len):
    fused, steps = both(exported.path)
    source = source_batch(5, 6, seed=target_len)
    mask = np.ones((5, 1, 6), dtype=bool)
    mask[0, 0, 4:] = mask[3, 0, 2:] = False  # right-padded rows
    got, got_attention = fused.predict(source, target_len, mask, return_attention=True)
    want, want_attention = steps.predict(source, target_len, mask, return_attention=True)
    if exported.spec.has_attention:  # the folded loop (export.points.folded): float32 rounding apart
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_attention, want_attention, rtol=1e-5, atol=1e-6)
    else:  # the step's own nodes, the same batch: bit for bit
        np.testing.assert_array_equal(got, want)
        assert got_attention is None and want_attention is None


@pytest.fixture(scope="module")
def eos_biased(tmp_path_factory, transformer_export) -> dict[str, Path]:
    """A bidirectional LSTM with dot attention and the session's transformer, eos made likely, exported."""
    import torch

    from training.tokens.recurrent import TokenSeq2Seq
    from training.tokens.transformer import TransformerSeq2Seq

    lstm = toy_token_spec(cell="lstm", bidirectional=True, attention="dot", hidden_dim=8, embedding_dim=6, layers=2)
    torch.manual_seed(3)
    models = {"lstm": TokenSeq2Seq(lstm).eval(),
              "transformer": TransformerSeq2Seq(transformer_export.model.spec).eval()}
    models["transformer"].load_state_dict(transformer_export.model.state_dict())
    out = {}
    for name, model in models.items():
        layer = model.output if hasattr(model, "output") and model.output is not None else model.decoder.output
        scale, offset = EOS_LOGIT[name]
        with torch.no_grad():
            layer.weight[EOS] *= scale
            layer.bias[EOS] += offset
        out[name] = export_token_model(model.spec, tmp_path_factory.mktemp(name) / "model", model=model).path
    return out


TEXTS = ["one is one", "two is two three", "three", "one two three four five", "two", "four is four", "five one"]


@pytest.mark.parametrize("name", ["lstm", "transformer"])
@pytest.mark.parametrize("options", [{}, {"min_decoding_length": 3}, {"max_decoding_length": 1},
                                     {"max_decoding_length": 7, "min_decoding_length": 7}])
def test_token_greedy_loop_equals_the_step_loop(eos_biased, name, options):
    fused, steps = both(eos_biased[name])
    texts = [t for t in TEXTS if len(t.split()) < fused.spec.max_positions]
    got = fused.translate_batch(texts, return_attention=True, **options)
    want = steps.translate_batch(texts, return_attention=True, **options)
    assert [h[0].ids for h in got] == [h[0].ids for h in want]
    np.testing.assert_allclose([h[0].score for h in got], [h[0].score for h in want], rtol=1e-6)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a[0].attention, b[0].attention, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["lstm", "transformer"])
def test_a_greedy_score_is_the_in_order_float64_sum_of_its_row(eos_biased, name):
    """GreedyLoop.tokens sums each row's float32 log-probs in Python: bit for bit np.cumsum's float64 running sum."""
    model = Seq2Seq.load(eos_biased[name], provider="cpu")
    steps = model.token_steps
    steps = steps.fast or steps
    ids, lengths = model.vocabularies["source"].encode_batch(TEXTS[:4])
    state = {"source_ids": ids, "source_lengths": lengths}
    state = state if set(state) <= set(steps.greedy.inputs) else steps.encode(ids, lengths)
    feed = {**{k: v for k, v in state.items() if k in steps.greedy.inputs},
            "max_length": np.array(7, np.int64), "min_length": np.array(0, np.int64)}
    raw = steps.greedy._run(feed)["token_log_probs"]
    assert raw.dtype == np.float32 and (raw == 0).any()  # rows ended early: zeros after their eos
    got = [h.score for h in steps.greedy.tokens(state, 7, 0, False)]
    assert got == np.cumsum(raw, axis=1, dtype=np.float64)[:, -1].tolist()


def test_feed_scalars_are_made_once_and_read_only():
    from runtime.fused import scalar

    five = scalar(5, "int64")
    assert five is scalar(5, "int64") and five.dtype == np.int64 and five.shape == () and int(five) == 5
    assert scalar(0.6, "float64").dtype == np.float64 and scalar(5, "float64") is not five
    with pytest.raises(ValueError, match="read-only"):
        five[...] = 6  # shared by every decode (and thread) that feeds a 5


def test_token_greedy_loop_mixes_ended_and_live_rows(eos_biased):
    """Rows end at different steps: the loop keeps running ended rows (their outputs masked) until all end."""
    for name, steps_wanted in (("lstm", 7), ("transformer", 7)):
        fused, steps = both(eos_biased[name])
        want = steps.translate_batch(TEXTS, max_decoding_length=steps_wanted)
        lengths = [len(h[0].ids) for h in want]
        assert len(set(lengths)) > 1 and steps_wanted in lengths, lengths  # EOS_LOGIT: rows end at different steps
        got = fused.translate_batch(TEXTS, max_decoding_length=steps_wanted)
        assert [h[0].ids for h in got] == [h[0].ids for h in want]
        # the step loop drops ended rows; a smaller batch may round a log-prob in its last float32 bit
        np.testing.assert_allclose([h[0].score for h in got], [h[0].score for h in want], rtol=1e-6)


def test_every_greedy_loop_reads_every_initializer_it_holds(exports, transformer_export, recurrent_export):
    """The index and axes of the nodes that carrying narrowed states takes out of the body leave with them, and the
    outer graph holds its index 0 only where it narrows: onnxruntime would warn of each unread initializer at every
    session it opens."""
    paths = [e.path for e in exports.values()] + [transformer_export.path, recurrent_export.path]
    for path in paths:
        model = onnx.load(str(path / GREEDY_FILE))
        graphs = [model.graph] + [a.g for n in model.graph.node if n.op_type in ("Loop", "Scan")
                                  for a in n.attribute if a.name == "body"]
        read = {name for g in graphs for n in g.node for name in n.input} | {o.name for g in graphs for o in g.output}
        assert not {w.name for g in graphs for w in g.initializer} - read, path
        assert not [n for g in graphs for n in g.node if n.op_type == "Constant" and n.output[0] not in read], path


def test_the_loop_graph_wraps_the_step_with_symbolic_lengths(exports, eos_biased):
    for path, spec in [(exports["none"].path, exports["none"].spec),
                       (eos_biased["transformer"], Seq2Seq.load(eos_biased["transformer"]).spec)]:
        model = onnx.load(str(path / GREEDY_FILE))
        onnx.checker.check_model(model, full_check=True)
        loops = [n for n in model.graph.node if n.op_type in ("Loop", "Scan")]
        # a point model's exactly target_len steps run in a Scan (export.scan_steps), a token model's in a Loop
        assert [n.op_type for n in loops] == ["Scan" if spec.kind == "points" else "Loop"]
        step_ops = sorted(n.op_type for n in onnx.load(str(path / "decoder_step.onnx")).graph.node)
        body_ops = [n.op_type for n in next(a.g for a in loops[0].attribute if a.name == "body").node]
        # every step node is inside, but the x[0] and unsqueeze of each state the loop carries narrow (and the
        # Constants of their index and axes)
        narrowed = sum(n.output[0].endswith("_narrow") for n in model.graph.node)
        missing = {op: max(0, step_ops.count(op) - body_ops.count(op)) for op in set(step_ops)}
        assert not any(n for op, n in missing.items() if op not in ("Gather", "Unsqueeze", "Constant")), missing
        assert missing.get("Constant", 0) <= 2 * narrowed, missing
        assert missing.get("Gather", 0) == missing.get("Unsqueeze", 0) == narrowed, (missing, narrowed)
        assert narrowed == (2 if spec.kind == "points" else 0)  # the previous point (N, 1, F) and hidden (1, N, H)
        declared = {**greedy_io(spec)["inputs"], **greedy_io(spec)["outputs"]}
        for value in [*model.graph.input, *model.graph.output]:
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            assert dims == declared[value.name], value.name
        assert any(DECODE_LEN in dims for dims in greedy_io(spec)["outputs"].values())


def test_a_zero_trip_loop_returns_declared_empty_shapes(exports):
    """Zero-trip scan outputs are where runtimes disagree; the graph reshapes them from its inputs."""
    exported = exports["multihead"]
    runtime = Seq2Seq.load(exported.path, fused=False)
    source, mask = source_batch(3, 4), np.ones((3, 1, 4), dtype=bool)
    states = runtime.run_encoder({"source": source, "source_mask": mask}) | {"source_mask": mask}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(exported.path / GREEDY_FILE), options, providers=["CPUExecutionProvider"])
    feed = {i.name: states[i.name] for i in session.get_inputs() if i.name != "target_len"}
    outputs, alphas = session.run(None, {**feed, "target_len": np.array(0, np.int64)})
    assert outputs.shape == (3, 0, 2) and alphas.shape == (3, exported.spec.n_heads, 0, 4)


def test_an_export_without_the_loop_graph_still_loads_and_decodes(exports, tmp_path):
    exported = exports["dot"]
    old = tmp_path / "old"
    shutil.copytree(exported.path, old)
    manifest = json.loads((old / MANIFEST_FILE).read_text())
    del manifest["graphs"][GREEDY_FILE]
    (old / MANIFEST_FILE).write_text(json.dumps(manifest))
    (old / GREEDY_FILE).unlink()
    runtime = Seq2Seq.load(old)
    assert not runtime.has_fused
    source = source_batch(2, 3)
    np.testing.assert_allclose(runtime.predict(source), Seq2Seq.load(exported.path).predict(source), rtol=1e-5,
                               atol=1e-6)  # the step loop against the folded greedy loop


def test_a_manifest_listing_an_unknown_graph_is_refused(exports, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(exports["dot"].path, bad)
    manifest = json.loads((bad / MANIFEST_FILE).read_text())
    manifest["graphs"]["beam_loop.onnx"] = manifest["graphs"][GREEDY_FILE]
    (bad / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"may list \['greedy_loop.onnx'\], got .*beam_loop.onnx"):
        Seq2Seq.load(bad)


@pytest.mark.parametrize("fused", [1, "yes", None])
def test_fused_must_be_a_bool(exports, fused):
    with pytest.raises(InputError, match="fused: expected True or False"):
        Seq2Seq.load(exports["dot"].path, fused=fused)


def test_infer_no_fused_prints_the_same_results(exports, eos_biased, python, tmp_path):
    """`seq2onnx infer --no-fused` runs the step loop: the same output as the default greedy loop."""
    import subprocess

    points = tmp_path / "points.npy"
    np.save(points, source_batch(3, 4))
    for args in ([str(exports["none"].path), "--input", str(points)],
                 [str(exports["dot"].path), "--input", str(points), "--attention"],
                 [str(eos_biased["lstm"]), *sum((["--text", t] for t in TEXTS), [])]):
        runs = [subprocess.run([python, "-m", "cli", "infer", *args, *extra], capture_output=True, text=True,
                               timeout=120) for extra in ([], ["--no-fused"])]
        assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
        assert runs[0].stdout
        if args[0] == str(exports["dot"].path):  # the folded loop: the same numbers, float32 rounding apart
            number = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
            numbers = [[float(x) for x in re.findall(number, r.stdout)] for r in runs]
            assert len(numbers[0]) == len(numbers[1]) > 0
            np.testing.assert_allclose(*numbers, rtol=1e-4, atol=1e-5)
            assert re.sub(number, "#", runs[0].stdout) == re.sub(number, "#", runs[1].stdout)
        else:
            assert runs[0].stdout == runs[1].stdout
