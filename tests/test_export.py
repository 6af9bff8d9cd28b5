"""Export: graph contract, parity matrix, manifest, atomic and non-overwriting writes."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from export.api import export_model
from export.errors import DestinationExistsError, ParityError
from export.parity import (
    DEFAULT_ATOL,
    DEFAULT_DRIFT_ATOL,
    DEFAULT_RTOL,
    ROUNDING,
    Tolerance,
    within_rounding,
)
from export.points.parity import BATCH_SIZES, SOURCE_LENS, TARGET_LENS
from runtime import Seq2Seq
from runtime.contract import (
    DECODER_STEP_FILE,
    DYNAMIC_DIMS,
    ENCODER_FILE,
    EXPORT_ID_KEY,
    FORMAT_VERSION,
    MANIFEST_FILE,
    SPEC_KEY,
    graph_io,
)
from runtime.model_files import sha256_file
from runtime.points import greedy_decode
from training.points.decode import reference_decode

from support.devices import DEVICES
from support.models import make_model, source_batch

# Parity between two float32 implementations of the same graph.
ATOL = 1e-5
RTOL = 1e-4


def manifest_of(exported) -> dict:
    return json.loads((exported.path / MANIFEST_FILE).read_text())


def test_parity_report_covers_the_whole_matrix(exported):
    parity = manifest_of(exported)["parity"]
    assert parity["passed"]
    assert (parity["atol"], parity["rtol"], parity["drift_atol"]) == (DEFAULT_ATOL, DEFAULT_RTOL, DEFAULT_DRIFT_ATOL)
    shapes = {(r["batch"], r["source_len"], r["target_len"]) for r in parity["cases"]}
    assert shapes == {(b, s, t) for b in BATCH_SIZES for s in SOURCE_LENS for t in TARGET_LENS}
    assert any(r["case"].startswith("padded") for r in parity["cases"])
    io = graph_io(exported.spec)
    expected = {f"encoder.{k}" for k in io[ENCODER_FILE]["outputs"]}
    expected |= {f"step.{k}" for k in io[DECODER_STEP_FILE]["outputs"]} | {"decode.outputs", "decode.step_loop.outputs"}
    expected |= {"decode.attention"} if exported.spec.has_attention else set()
    assert set(parity["summary"]) == expected
    for output, worst in parity["summary"].items():
        assert worst["max_abs"] <= DEFAULT_ATOL, output  # untrained models stay tight even free-running


def test_manifest_contract(exported):
    text = (exported.path / MANIFEST_FILE).read_text()
    manifest = json.loads(text)
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert manifest["format_version"] == FORMAT_VERSION and manifest["opset"] == 17
    assert manifest["spec"] == exported.spec.to_dict()
    assert {"torch", "onnx", "onnxruntime"} <= set(manifest["producer"])
    for name, io in graph_io(exported.spec).items():
        entry = manifest["graphs"][name]
        assert entry["sha256"] == sha256_file(exported.path / name)
        assert entry["inputs"] == io["inputs"] and entry["outputs"] == io["outputs"]


def test_graphs_have_symbolic_dims_and_pass_the_checker(exported):
    for name, io in graph_io(exported.spec).items():
        model = onnx.load(str(exported.path / name))
        onnx.checker.check_model(model, full_check=True)
        declared = {**io["inputs"], **io["outputs"]}
        values = [*model.graph.input, *model.graph.output]
        assert sorted(v.name for v in values) == sorted(declared)
        for value in values:
            dims = value.type.tensor_type.shape.dim
            for dim, want in zip(dims, declared[value.name]):
                if want in DYNAMIC_DIMS:
                    assert not dim.HasField("dim_value") and dim.dim_param == want, (name, value.name)
                else:
                    assert dim.dim_value == want
        meta = {p.key: p.value for p in model.metadata_props}
        assert json.loads(meta[SPEC_KEY]) == exported.spec.to_dict()
        assert meta[EXPORT_ID_KEY] == manifest_of(exported)["export_id"]
        assert model.doc_string


def test_step_graph_has_attention_io_only_with_attention(exported):
    inputs = {i.name for i in onnx.load(str(exported.path / DECODER_STEP_FILE)).graph.input}
    assert ("keys_t" in inputs) == exported.spec.has_attention
    assert ("source_mask" in inputs) == exported.spec.has_attention


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,source_len,target_len", [(1, 1, 1), (3, 7, 20), (64, 2, 2)])
def test_runtime_matches_pytorch(exported, device, batch, source_len, target_len):
    runtime = Seq2Seq.load(exported.path, provider=device)
    source = source_batch(batch, source_len, seed=batch + source_len)
    out, alphas = runtime.predict(source, target_len, return_attention=True)
    ref, ref_alphas = reference_decode(exported.model, torch.from_numpy(source), target_len)
    np.testing.assert_allclose(out, ref.numpy(), atol=ATOL, rtol=RTOL)
    if exported.spec.has_attention:
        np.testing.assert_allclose(alphas, ref_alphas.numpy(), atol=ATOL, rtol=RTOL)
    else:
        assert alphas is None


def test_reference_evaluator_agrees(exported):
    """onnx's own reference implementation, an independent reading of the same graphs."""
    evaluators = {name: ReferenceEvaluator(str(exported.path / name)) for name in (ENCODER_FILE, DECODER_STEP_FILE)}
    io = graph_io(exported.spec)

    def runner(name):
        outputs = list(io[name]["outputs"])
        return lambda feed: dict(zip(outputs, evaluators[name].run(None, feed)))

    source = source_batch(3, 4, seed=5)
    mask = np.ones((3, 1, 4), dtype=bool)
    mask[1, 0, 3:] = False
    mask[2, 0, 1:] = False
    got, got_alphas = greedy_decode(runner(ENCODER_FILE), runner(DECODER_STEP_FILE),
                                    list(io[DECODER_STEP_FILE]["inputs"]), source, mask, 6)
    ort_out, ort_alphas = Seq2Seq.load(exported.path).predict(source, 6, mask, return_attention=True)
    ref, ref_alphas = reference_decode(exported.model, torch.from_numpy(source), 6, torch.from_numpy(mask))
    np.testing.assert_allclose(got, ort_out, atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(got, ref.numpy(), atol=ATOL, rtol=RTOL)
    if exported.spec.has_attention:
        np.testing.assert_allclose(got_alphas, ort_alphas, atol=ATOL, rtol=RTOL)
        np.testing.assert_allclose(got_alphas, ref_alphas.numpy(), atol=ATOL, rtol=RTOL)


def test_batch_invariance_and_padding(exported):
    runtime = Seq2Seq.load(exported.path)
    source = source_batch(5, 4, seed=9)
    batched, batched_alphas = runtime.predict(source, 5, return_attention=True)
    for i in range(len(source)):
        alone = runtime.predict(source[i : i + 1], 5)
        np.testing.assert_allclose(alone[0], batched[i], atol=ATOL, rtol=RTOL)
    # Item 0 padded with garbage to length 7 and masked: same prediction as unpadded.
    padded = np.concatenate([source, np.full((5, 3, 2), 50.0, np.float32)], axis=1)  # (5, 7, 2)
    mask = np.zeros((5, 1, 7), dtype=bool)
    mask[:, :, :4] = True
    out, alphas = runtime.predict(padded, 5, mask, return_attention=True)
    np.testing.assert_allclose(out, batched, atol=ATOL, rtol=RTOL)
    if exported.spec.has_attention:
        np.testing.assert_allclose(alphas[..., :4], batched_alphas, atol=ATOL, rtol=RTOL)
        assert np.all(alphas[..., 4:] < 1e-8)


def test_parity_failure_lists_every_failure_and_writes_nothing(tmp_path):
    model, _ = make_model("dot", seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # larger weights: float32 rounding differences well above 1e-12
    out = tmp_path / "model"
    with pytest.raises(ParityError) as info:
        export_model(model, out, tol=Tolerance(atol=1e-12, rtol=0, drift_atol=1e-12))
    message = str(info.value)
    for output in ("step.output", "step.hidden_out", "step.alphas", "decode.outputs", "decode.attention"):
        assert output in message
    assert "max_abs=" in message and message.count("\n") >= 5  # one line per failing check
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_rounding_is_read_against_the_tolerances_an_export_is_checked_at():
    """A difference beyond a tighter tolerance is rounding when it is tiny, or within the export's own tolerances
    (a few float32 steps of a never-output id's log-prob, 9.8e-4 at -1e4; ~1e-4 carried through a recurrent model's
    steps at -11, which `verify --atol 0 --rtol 0` blamed on the pair): `verify` then blames the tolerance."""
    want = np.array([[-1e4, -0.5, -3.0]], np.float32)
    step = float(np.spacing(np.float32(1e4)))
    assert step == 2.0 ** -10
    off_by = lambda d: want + np.array([[d, 1e-7, 0.0]], np.float32)  # noqa: E731
    assert within_rounding(off_by(2 * step), want, atol=1e-3, rtol=0.0)
    assert within_rounding(off_by(50 * step), want, atol=0.0, rtol=0.0)  # 0.05 at -1e4: 5e-6 of it
    assert not within_rounding(off_by(2.0), want, atol=1e-3, rtol=0.0)  # 2e-4 of it: beyond DEFAULT_RTOL
    recurrent = np.array([[-10.9, -14.7]], np.float32)
    assert within_rounding(recurrent + np.float32(1.18e-4), recurrent, atol=0.0, rtol=0.0)
    assert not within_rounding(recurrent + np.float32(2e-3), recurrent, atol=0.0, rtol=0.0)
    assert not within_rounding(want + np.array([[0.0, 1e-3, 0.0]], np.float32), want, atol=1e-5, rtol=0.0)
    decode = np.array([[0.5]], np.float32)  # a point decode's drift is judged against its own default, 1e-3
    assert within_rounding(decode + np.float32(8e-4), decode, atol=0.0, rtol=0.0, accepted_atol=DEFAULT_DRIFT_ATOL)
    assert not within_rounding(decode + np.float32(8e-4), decode, atol=0.0, rtol=0.0)
    minus_inf = np.array([[-np.inf, -1.0]], np.float32)  # -inf on both sides is equal, on one side not rounding
    assert within_rounding(minus_inf.copy(), minus_inf, atol=0.0, rtol=0.0)
    assert not within_rounding(np.array([[-1e4, -1.0]], np.float32), minus_inf, atol=0.0, rtol=0.0)
    assert not within_rounding(np.array([[np.nan, -1.0]], np.float32), minus_inf, atol=0.0, rtol=0.0)
    assert not within_rounding(want[:, :2], want, atol=1.0, rtol=0.0)  # shapes differ
    # one check holding both kinds, element by element: a few steps at -1e4 beside a small difference at -0.5
    assert within_rounding(want + np.array([[2 * step, 5e-6, 0.0]], np.float32), want, atol=1e-9, rtol=0.0)
    assert not within_rounding(want + np.array([[2 * step, 3 * ROUNDING, 0.0]], np.float32), want, atol=1e-9,
                               rtol=0.0)


def test_a_beam_scores_row_says_when_its_differences_are_rounding():
    """verify reads a failed row's rounding flag: a scores row must carry it, not drop it."""
    from export.tokens.parity import _scores_row
    from runtime.search.step import Hypothesis
    ids = np.zeros((1, 3), np.int64)
    ours = [[Hypothesis([4, 5], -1.0, -2.0)]]
    tight = Tolerance(atol=1e-9, rtol=0.0)
    near = _scores_row("c", ids, 5, ours, [[Hypothesis([4, 5], -1.0 + 5e-6, -2.0)]], tight, "beam_graph")
    assert not near.ok and near.rounding
    far = _scores_row("c", ids, 5, ours, [[Hypothesis([4, 5], -1.0 + 1e-2, -2.0)]], tight, "beam_graph")
    assert not far.ok and not far.rounding


def test_a_graph_failure_is_caught_even_when_the_decode_tolerance_is_loose(tmp_path):
    model, _ = make_model("multihead", seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    with pytest.raises(ParityError, match="step.output") as info:
        export_model(model, tmp_path / "m", tol=Tolerance(atol=1e-12, rtol=0, drift_atol=1.0))
    assert "decode.outputs" not in str(info.value)


def test_existing_export_is_kept_without_force_and_replaced_with_it(tmp_path):
    model, _ = make_model("none", seed=4)
    out = export_model(model, tmp_path / "m")
    before = (out / MANIFEST_FILE).read_bytes()
    with pytest.raises(DestinationExistsError, match="--force"):
        export_model(model, out)
    assert (out / MANIFEST_FILE).read_bytes() == before
    export_model(model, out, force=True)
    assert json.loads((out / MANIFEST_FILE).read_text())["export_id"] != json.loads(before)["export_id"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp or backup dirs left


def test_published_directories_are_readable_by_others(tmp_path):
    """Exports and checkpoints get the umask's permissions, not a private temp dir's 0700."""
    import os
    import stat

    from training.checkpoint import save_checkpoint
    from training.points.trainer import TrainConfig

    model, spec = make_model("none", seed=5)
    (tmp_path / "plain").mkdir()
    expected = stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    exported = export_model(model, tmp_path / "export")
    checkpoint = save_checkpoint(tmp_path / "ckpt", model, spec, TrainConfig(), {"train": [1.0], "val": [1.0]},
                                 {"name": "squares"})
    for published in (exported, checkpoint):
        assert stat.S_IMODE(os.stat(published).st_mode) == expected, published


def test_force_never_replaces_a_directory_that_is_not_an_export(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    model, _ = make_model("none")
    with pytest.raises(DestinationExistsError, match="not a seq2onnx export"):
        export_model(model, precious, force=True)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_export_leaves_the_callers_model_untouched(tmp_path):
    model, _ = make_model("dot", seed=6)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_model(model, tmp_path / "m")
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _mismatched_model():
    """An encoder of hidden 4 under a decoder of hidden 8: torch cannot run it."""
    from training.points.models import DecoderAttn, Encoder, EncoderDecoderAttn

    return EncoderDecoderAttn(Encoder(2, 4), DecoderAttn(2, 8), input_len=2, target_len=2)


def _nan_model():
    model, _ = make_model("dot", seed=7)
    with torch.no_grad():
        next(model.decoder.parameters())[0, 0] = float("nan")
    return model


@pytest.mark.parametrize(("make", "options", "error", "says"), [
    (lambda: make_model("dot")[0].double(), {}, "ExportError", "is float64, expected float32"),
    (_nan_model, {}, "ExportError", "holds 1 NaN or infinite value of"),
    (_mismatched_model, {}, "ExportError", "in-memory EncoderDecoderAttn: could not be traced for ONNX"),
    (lambda: make_model("dot")[0], dict(opset=99), "UsageError", "opset: expected an int in"),
    (lambda: make_model("dot")[0], dict(opset="17"), "UsageError", "opset: expected an int in"),
    (lambda: make_model("dot")[0], dict(quantize="int4"), "UsageError", "quantize: expected None or one of"),
    (lambda: make_model("dot")[0], dict(dtype="bf16"), "UsageError", "dtype: expected one of"),
], ids=["float64", "nan-weight", "sizes-do-not-fit", "opset-99", "opset-str", "quantize", "dtype"])
def test_a_model_or_option_that_cannot_be_exported_is_a_typed_error(tmp_path, make, options, error, says):
    """Each is a Seq2OnnxError naming the model (or option) and what was wrong, not torch's raw error or a parity
    failure that blames the export; nothing is written."""
    from runtime.errors import Seq2OnnxError

    with pytest.raises(Seq2OnnxError) as caught:
        export_model(make(), tmp_path / "m", **options)
    assert type(caught.value).__name__ == error and says in str(caught.value), repr(caught.value)
    assert not (tmp_path / "m").exists() and sorted(p.name for p in tmp_path.iterdir()) == []
