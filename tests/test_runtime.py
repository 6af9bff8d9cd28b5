"""Runtime: load-time integrity, strict inputs, providers, threads, and no torch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from runtime import Seq2Seq
from runtime.contract import DECODER_STEP_FILE, ENCODER_FILE, MANIFEST_FILE
from runtime.defaults import MAX_TARGET_LEN
from runtime.errors import InputError, IntegrityError, ManifestError, ProviderError
from runtime.model_files import sha256_file
from runtime.point_inputs import SHARED_MASK_SIZE, check_mask, check_outputs
from runtime.sessions import max_threads

from support.devices import DEVICES
from support.models import source_batch


@pytest.fixture
def copy_of(tmp_path, exports):
    """A private copy of the dot-attention export, safe to damage."""
    dest = tmp_path / "model"
    shutil.copytree(exports["dot"].path, dest)
    return dest


@pytest.fixture(scope="module")
def dot(exports):
    return Seq2Seq.load(exports["dot"].path, provider="cpu")


def nested(value, depth):
    """value wrapped in `depth` more lists."""
    for _ in range(depth):
        value = [value]
    return value


def edit_manifest(path, **changes):
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    manifest.update(changes)
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))
    return manifest


# ---- load-time checks ---------------------------------------------------------------------

def test_tampered_graph_is_an_integrity_error(copy_of):
    data = bytearray((copy_of / ENCODER_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy_of / ENCODER_FILE).write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256 .* does not match"):
        Seq2Seq.load(copy_of)


def test_truncated_graph_is_an_integrity_error(copy_of):
    data = (copy_of / DECODER_STEP_FILE).read_bytes()
    (copy_of / DECODER_STEP_FILE).write_bytes(data[: len(data) // 3])
    with pytest.raises(IntegrityError, match=DECODER_STEP_FILE):
        Seq2Seq.load(copy_of)


def test_missing_graph_is_an_integrity_error(copy_of):
    (copy_of / ENCODER_FILE).unlink()
    with pytest.raises(IntegrityError, match="missing"):
        Seq2Seq.load(copy_of)


def test_missing_manifest_is_a_manifest_error(copy_of):
    (copy_of / MANIFEST_FILE).unlink()
    with pytest.raises(ManifestError, match="no manifest"):
        Seq2Seq.load(copy_of)


def test_unknown_format_version_names_the_understood_ones(copy_of):
    edit_manifest(copy_of, format_version=99)
    with pytest.raises(ManifestError, match=r"format_version 99 .* understood versions: \[1, 2\]"):
        Seq2Seq.load(copy_of)


def test_malformed_manifest_is_a_manifest_error(copy_of):
    (copy_of / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Seq2Seq.load(copy_of)


def test_manifest_spec_that_disagrees_with_the_graphs_is_refused(copy_of):
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    edit_manifest(copy_of, spec={**manifest["spec"], "hidden_dim": 7})
    with pytest.raises(ManifestError, match=r"encoder.onnx output 'hidden': manifest declares \[1, 'batch', 5\], "
                                            r"the spec \(hidden_dim=7\) implies \[1, 'batch', 7\]; .* re-export"):
        Seq2Seq.load(copy_of)


def test_manifest_spec_edit_that_keeps_the_graph_io_is_refused(copy_of):
    """target_len changes no graph input or output: only the spec in the graphs' metadata can catch it."""
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    edit_manifest(copy_of, spec={**manifest["spec"], "target_len": 5})
    with pytest.raises(IntegrityError, match=r"spec differs .* \(target_len: graph 2, manifest 5\)"):
        Seq2Seq.load(copy_of)


@pytest.mark.parametrize("field,value,match", [
    ("sha256", 12, r"'sha256'\] must be 64 lowercase hex digits, got 12"),
    ("inputs", ["source"], r"encoder.onnx inputs: manifest declares \['source'\]"),
    ("inputs", {"source": ["batch", "source_len", 2.0], "source_mask": ["batch", 1, "source_len"]},
     r"input 'source': manifest declares \['batch', 'source_len', 2.0\]"),
    ("file", None, r"'file'\] is None, which is not a string"),
])
def test_mistyped_graph_entries_are_manifest_errors(copy_of, field, value, match):
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    manifest["graphs"][ENCODER_FILE][field] = value
    (copy_of / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=match):
        Seq2Seq.load(copy_of)


@pytest.mark.parametrize("version", [True, 1.0, "1", [1], {"v": 1}])
def test_format_version_must_be_the_int_itself(copy_of, version):
    """A version of another type says so (a "2" said it was not understood, beside understood versions [1, 2];
    found by a fresh walk)."""
    edit_manifest(copy_of, format_version=version)
    with pytest.raises(ManifestError, match=f"format_version must be an integer, got {type(version).__name__} "):
        Seq2Seq.load(copy_of)


def test_a_format_version_from_the_future_is_not_understood(copy_of):
    edit_manifest(copy_of, format_version=99)
    with pytest.raises(ManifestError, match=r"format_version 99 is not understood by this runtime; understood"):
        Seq2Seq.load(copy_of)


def test_a_manifest_without_format_version_says_it_has_none(copy_of):
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    del manifest["format_version"]
    (copy_of / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="has no format_version .every seq2onnx manifest has one."):
        Seq2Seq.load(copy_of)


def test_a_graph_swapped_for_another_names_what_differs(copy_of):
    """One graph of the export copied over another, its hash put in the manifest: the I/O differences, by name, and
    the way out, not both I/O dicts whole."""
    shutil.copy(copy_of / ENCODER_FILE, copy_of / DECODER_STEP_FILE)
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    manifest["graphs"][DECODER_STEP_FILE]["sha256"] = sha256_file(copy_of / DECODER_STEP_FILE)
    (copy_of / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=r"inputs and outputs do not match the manifest's \(input .* missing.*"
                                             r"re-export the model") as info:
        Seq2Seq.load(copy_of)
    assert len(str(info.value)) < 600


def test_graphs_from_different_exports_are_refused(copy_of, exports, tmp_path):
    from export.api import export_model

    other = export_model(exports["dot"].model, tmp_path / "other")  # same model, another export
    shutil.copy(other / DECODER_STEP_FILE, copy_of / DECODER_STEP_FILE)
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    manifest["graphs"][DECODER_STEP_FILE]["sha256"] = sha256_file(copy_of / DECODER_STEP_FILE)
    (copy_of / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="different exports"):
        Seq2Seq.load(copy_of)


# ---- providers ----------------------------------------------------------------------------

def test_unknown_provider_is_refused(exports):
    """An unknown provider name is a bad argument, an InputError (a ValueError) as every other; it was a
    ProviderError (a RuntimeError), which says a valid provider cannot run here, so a caller catching ValueError
    for bad arguments missed it (found by a fresh walk)."""
    with pytest.raises(InputError, match="expected one of"):
        Seq2Seq.load(exports["dot"].path, provider="tpu")


def test_a_device_id_with_the_cpu_provider_is_refused(exports):
    """device_id picks a GPU: with provider 'cpu' it changed nothing, silently (the CLI refuses --device-id with
    --provider cpu; found by a fresh walk)."""
    with pytest.raises(InputError, match="device_id: 7 picks a GPU; with provider 'cpu'"):
        Seq2Seq.load(exports["dot"].path, provider="cpu", device_id=7)
    assert Seq2Seq.load(exports["dot"].path, provider="cpu", device_id=0).providers == ["CPUExecutionProvider"]


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA really works here")
def test_cuda_without_cuda_is_an_error_naming_what_is_missing(exports):
    with pytest.raises(ProviderError, match="provider 'cuda'"):
        Seq2Seq.load(exports["dot"].path, provider="cuda")


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA really works here")
def test_auto_asks_for_cuda_once_where_it_does_not_start(exports, monkeypatch):
    """onnxruntime-gpu lists CUDA as available without its libraries or a GPU, and every 'auto' session asking
    for it printed onnxruntime's two error lines about the missing libraries (12 lines for one `infer` of the
    dates model there). A build that lists CUDA and cannot start it is what this CPU build is asked to be: its
    sessions given CUDA run on the CPU and warn once each, as onnxruntime-gpu's log once each."""
    from runtime import sessions

    monkeypatch.setattr(sessions.ort, "get_available_providers", lambda: [sessions.CUDA, sessions.CPU])
    monkeypatch.setattr(sessions, "_CUDA_DID_NOT_START", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models = [Seq2Seq.load(exports["dot"].path, provider="auto") for _ in range(2)]
    asked = [w for w in caught if "Specified provider 'CUDAExecutionProvider'" in str(w.message)]
    assert len(asked) == 1, [str(w.message) for w in caught]
    assert all(model.providers == [sessions.CPU] for model in models)
    assert sessions._CUDA_DID_NOT_START == {0}


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA really works here")
def test_a_cuda_session_that_fails_to_start_falls_back_under_auto_and_prints_nothing(exports, monkeypatch, capfd):
    """Where creating a session with CUDA raises (a GPU machine whose CUDA provider fails at start), onnxruntime's
    own fallback printed an 'EP Error' banner on stdout and tried again. Now 'auto' takes the CPU itself, and
    'cuda' is a ProviderError naming what failed; stdout stays empty. The failing CUDA start is made here (this
    CPU build cannot fail it); the CPU sessions are real."""
    from runtime import sessions

    real = sessions.ort.InferenceSession

    def failing_cuda(data, sess_options=None, providers=(), **kwargs):
        if sessions.CUDA in providers:
            raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")
        return real(data, sess_options=sess_options, providers=providers, **kwargs)

    monkeypatch.setattr(sessions.ort, "get_available_providers", lambda: [sessions.CUDA, sessions.CPU])
    monkeypatch.setattr(sessions.ort, "InferenceSession", failing_cuda)
    monkeypatch.setattr(sessions, "_CUDA_DID_NOT_START", set())
    assert Seq2Seq.load(exports["dot"].path, provider="auto").providers == [sessions.CPU]
    assert sessions._CUDA_DID_NOT_START == {0}
    with pytest.raises(ProviderError, match="on CUDA device 0 .*no CUDA-capable device is detected"):
        Seq2Seq.load(exports["dot"].path, provider="cuda")
    assert capfd.readouterr().out == ""


# onnxruntime-gpu 1.31.1's error for device_id 3 on a machine of one GPU (an H200, 2026-11-30), whole
NO_DEVICE_3 = ("/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc:63 static "
               "onnxruntime::CUDAExecutionProviderInfo onnxruntime::CUDAExecutionProviderInfo::FromProviderOptions("
               "const onnxruntime::ProviderOptions&) [ONNXRuntimeError] : 1 : FAIL : provider_options_utils.h:187 "
               "Parse Failed to parse provider option \"device_id\": cuda_execution_provider_info.cc:71 operator() "
               "Invalid device ID: 3, must be between 0 (inclusive) and 1 (exclusive).")


@pytest.mark.parametrize("count, sees", [
    (1, "1 CUDA device (device_id 0); pass one of those as device_id (infer --device-id), or provider 'cpu'"),
    (4, "4 CUDA devices (device_id 0 to 3); pass one of those as device_id (infer --device-id), or provider 'cpu'"),
    (0, "no CUDA device; pass provider 'cpu' (--provider cpu)")])
def test_a_cuda_device_past_the_gpus_is_said_so(count, sees):
    """onnxruntime's error for an ordinal past the GPUs came wrapped in its source paths; it is said plainly, with
    the ordinals there are. Other failures keep onnxruntime's words."""
    from runtime.cuda import cuda_start_error

    error = cuda_start_error("encoder.onnx", ["CUDAExecutionProvider"], 3,
                             RuntimeError(NO_DEVICE_3.replace("and 1 (exclusive)", f"and {count} (exclusive)")))
    assert str(error) == f"encoder.onnx: there is no CUDA device 3: onnxruntime sees {sees}"
    other = cuda_start_error("encoder.onnx", ["CUDAExecutionProvider"], 0, RuntimeError("CUDA failure 100: no GPU"))
    assert "could not start a session" in str(other) and "CUDA failure 100: no GPU" in str(other)


def test_auto_reports_the_providers_it_got(exports):
    model = Seq2Seq.load(exports["dot"].path, provider="auto")
    expected = "CUDAExecutionProvider" if "cuda" in DEVICES else "CPUExecutionProvider"
    assert model.providers[0] == expected
    assert model.spec == exports["dot"].spec


# ---- load arguments -----------------------------------------------------------------------

def test_max_threads_is_the_usable_cpu_count():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert max_threads() == expected >= 1


def test_threads_up_to_the_cpu_count_load(exports):
    model = Seq2Seq.load(exports["dot"].path, provider="cpu", threads=max_threads())
    assert model.predict(source_batch(1, 2)).shape == (1, 2, 2)


def test_threads_beyond_the_cpu_count_are_refused_before_reading_anything(tmp_path):
    too_many = max_threads() + 1
    message = rf"threads: {too_many} is more than the {max_threads()} CPUs .* oversubscribes"
    with pytest.raises(InputError, match=message):
        Seq2Seq.load(tmp_path / "no-such-model", threads=too_many)  # not a ManifestError: nothing was read


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(exports, bad):
    with pytest.raises(InputError, match="threads: expected a positive int or None"):
        Seq2Seq.load(exports["dot"].path, threads=bad)


@pytest.mark.parametrize("bad", [3, None, b"artifacts/squares", ["model"], "model\0dir"])
def test_a_path_that_is_not_a_path_is_an_input_error(bad):
    with pytest.raises(InputError, match="path: expected a str or os.PathLike"):
        Seq2Seq.load(bad)


# ---- inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,match", [
    (np.zeros((3, 2), np.float32), r"source: expected shape \(batch, source_len, 2\).*source\[None\]"),
    (np.zeros((1, 2, 3), np.float32), r"source: expected shape .* got shape \(1, 2, 3\)"),
    (np.zeros((1, 0, 2), np.float32), r"source_len >= 1"),
    (np.array([[[1.0, "a"]]], dtype=object), r"source: expected floating-point .* got shape \(1, 1, 2\) dtype object "
                                             r"\(Python objects: mixed types, None or integers beyond int64\); pass"),
    (np.array([[["1", "2"]]]), r"source: expected floating-point or integer .* dtype <U1"),
    (np.ones((1, 2, 2), bool), r"source: expected floating-point or integer .* dtype bool"),
    (np.ones((1, 2, 2), complex), r"dtype complex128"),
    (np.zeros((1, 2, 2), "datetime64[s]"), r"dtype datetime64\[s\]"),
    ([[[10**30, 1]]], r"got a list of shape \(1, 1, 2\), holding values other than numbers \(null, objects, mixed "
                      r"types or integers beyond int64\)"),  # lists: no numpy dtype, which the caller never named
    ([[["1", "2"]]], r"got a list of shape \(1, 1, 2\), holding strings; pass numbers"),
    ([[[1, "b"]]], r"holding strings; pass numbers"),  # a string among numbers
    ([[[None, 1.0]]], r"holding values other than numbers \(null"),
    ([1.0, 2.0], r"expected shape \(batch, source_len, 2\), got a list of shape \(2,\), holding numbers$"),
    ([[]], r"got a list of shape \(1, 0\), holding nothing$"),
    ({"source": [[[1.0, 2.0]]]}, r"got a dict \(\{'source': \[\[\[1.0, 2.0\]\]\]\}\); pass numbers"),
    (None, r"values \(cast to float32\), got None; pass numbers"),
    (np.array(None), r"got shape \(\) dtype object; pass numbers"),
    ("[[[-1, -1]]]", r"got a str \('\[\[\[-1, -1\]\]\]'\); pass numbers"),
    (b"ab", r"got a bytes \(b'ab'\); pass numbers"),
    (np.array("ab"), r"got shape \(\) dtype <U2; pass numbers"),
    (np.ma.masked_array(np.zeros((1, 2, 2)), mask=True), r"source: got a numpy masked array.*source_mask"),
    ([[[1.0, 2.0], [3.0]]], r"source: expected a numeric array of shape \(N, L, 2\); got lists of different lengths: "
                            r"source\[0\]\[1\] has 1 item where source\[0\]\[0\] has 2 items; pass nested lists"),
    ([[[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0]]], r"source\[1\] has 2 items where source\[0\] has 1 item"),
    ([[[1.0, 2.0], [3.0, [4.0]]]], r"source\[0\]\[1\]\[1\] has 1 item where source\[0\]\[0\]\[0\] has a single value"),
    (5, r"expected shape \(batch, source_len, 2\), got an int \(5\)$"),  # one value: no numpy dtype
    (5.0, r"got a float \(5.0\)$"),
    (nested([[1.0, 2.0]], 70), r"source: expected a numeric array .* numpy cannot turn into an array"),
    (np.array([[[0.0, 1.0]], [[np.nan, 0.0]]], np.float32), r"NaN or Inf \(first in batch item 1\)"),
    (np.array([[[np.inf, 1.0]]]), r"NaN or Inf"),
    ([[[0.0, 0.0]], [[0.0, 1e40]]], r"value 1e\+40 in batch item 1 exceeds the float32 range \(±3.4e38\)"),
    (np.array([[[-1e39, 0.0]]]), r"value -1e\+39 in batch item 0 exceeds the float32 range"),
])
def test_bad_sources_are_refused_by_name(dot, bad, match):
    """Each message names source, what was expected and what was given, on one line."""
    with pytest.raises(InputError, match=match) as info:
        dot.predict(bad)
    assert "\n" not in str(info.value)


def test_integer_sources_decode_exactly_like_floats(dot):
    """JSON has no int/float distinction: [[[-1,-1],[-1,1]]] is the same request as its float spelling."""
    expected = dot.predict([[[-1.0, -1.0], [-1.0, 1.0]]])
    np.testing.assert_array_equal(dot.predict([[[-1, -1], [-1, 1]]]), expected)
    for dtype in (np.int8, np.int32, np.int64):
        np.testing.assert_array_equal(dot.predict(np.array([[[-1, -1], [-1, 1]]], dtype)), expected)
    np.testing.assert_array_equal(dot.predict(np.array([[[0, 3], [2, 1]]], np.uint8)),
                                  dot.predict([[[0.0, 3.0], [2.0, 1.0]]]))


def test_outputs_that_overflow_inside_the_model_are_an_input_error(exports):
    """A model whose step overflows (large weights, extreme inputs) raises rather than returning NaN (the step
    loop's run_step is patched here; the greedy loop's outputs go through the same check)."""
    model = Seq2Seq.load(exports["dot"].path, provider="cpu", fused=False)
    step = model.run_step

    def overflowing(feed):
        result = step(feed)
        result["output"][1] = np.nan  # item 1 overflowed
        return result

    model.run_step = overflowing
    message = r"batch item 1 \(largest \|value\| 3e\+38\) made the model's outputs overflow"
    with pytest.raises(InputError, match=message):
        model.predict(np.array([[[0.0, 1.0]], [[3e38, 1.0]]]))


@pytest.mark.parametrize("where", ["outputs", "attention"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_every_non_finite_output_is_named_by_its_batch_item(where, bad):
    source = np.ones((3, 2, 2), np.float32)
    arrays = {"outputs": np.full((3, 4, 2), 3e38, np.float32), "attention": np.full((3, 4, 2), 0.5, np.float32)}
    check_outputs(source, arrays["outputs"], arrays["attention"])  # finite, though their float32 sum is not
    arrays[where][2, 3, 1] = bad
    with pytest.raises(InputError, match="batch item 2 "):
        check_outputs(source, arrays["outputs"], arrays["attention"])
    if where == "outputs":
        with pytest.raises(InputError, match="batch item 2 "):
            check_outputs(source, arrays["outputs"], None)


def test_inf_beside_minus_inf_is_named_without_a_numpy_warning(dot):
    """Their sum is NaN: the finiteness checks must still raise InputError, under the strictest numpy settings."""
    outputs = np.zeros((2, 3, 2), np.float32)
    outputs[1, 0, 0], outputs[1, 2, 1] = np.inf, -np.inf
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="batch item 1 "):
            check_outputs(np.ones((2, 2, 2), np.float32), outputs, None)
        with pytest.raises(InputError, match=r"NaN or Inf \(first in batch item 0\)"):
            dot.predict(np.array([[[np.inf, -np.inf], [0.0, 0.0]]], np.float32))
        with pytest.raises(InputError, match="exceeds the float32 range"):
            dot.predict(np.array([[[1e300, -1e300], [0.0, 0.0]]]))


def test_graph_level_calls_turn_onnxruntime_failures_into_input_errors(dot):
    """run_encoder/run_step are fed by parity tools, unchecked: onnxruntime's own errors still come back typed."""
    feed = {"source": np.zeros((1, 2, 3), np.float32), "source_mask": np.ones((1, 1, 2), bool)}  # 3 features, not 2
    with pytest.raises(InputError, match=r"encoder.onnx: onnxruntime could not run on inputs of shapes .*\(1, 2, 3\)"):
        dot.run_encoder(feed)


def test_float32_extremes_are_accepted(dot):
    out = dot.predict(np.array([[[3.4e38, -3.4e38], [1e-45, 0.0]]]))
    assert out.dtype == np.float32 and np.isfinite(out).all()


@pytest.mark.parametrize("bad", [0, -1, MAX_TARGET_LEN + 1, 2.5, True, "3"])
def test_bad_target_len_is_refused(dot, bad):
    with pytest.raises(InputError, match="target_len: expected an int"):
        dot.predict(source_batch(1, 2), target_len=bad)


@pytest.mark.parametrize("mask,match", [
    (np.ones((2, 1, 3), bool), r"source_mask: expected shape \(2, 2\) or \(2, 1, 2\)"),
    (np.full((2, 1, 2), 0.5, np.float32), r"source_mask: expected only 0 and 1 values, got 0.5 in item 0"),
    (np.array([[[1.0, np.nan]], [[1.0, 1.0]]]), r"got nan in item 0"),
    (np.full((2, 1, 2), "1"), r"source_mask: expected bool or 0/1 numbers, got shape \(2, 1, 2\) dtype <U1"),
    (np.full((2, 1, 2), 1 + 0j), r"source_mask: expected bool or 0/1 numbers, .* complex128"),
    (np.array([[1, None], [1, 1]], dtype=object), r"source_mask: expected bool or 0/1 numbers, got shape \(2, 2\) "
                                                  r"dtype object \(Python objects: mixed types, None or integers"),
    ([["1", "0"], ["1", "1"]],
     r"source_mask: expected bool or 0/1 numbers, got a list of shape \(2, 2\), holding strings;"),
    ([[1, 1, 1], [1, 1, 1]], r"to match source, got a list of shape \(2, 3\), holding numbers$"),
    ({1, 0}, r"source_mask: expected bool or 0/1 numbers, got a set \(\{0, 1\}\); pass True/False"),
    (object(), r"source_mask: expected bool or 0/1 numbers, got an object \(<object object"),
    (np.ma.masked_array(np.ones((2, 2), bool), mask=[[0, 1], [0, 0]]), r"source_mask: got a numpy masked array"),
    (np.full((2, 1, 2), 2, np.int64), r"only 0 and 1"),
    ([[1, 1], [1]], r"source_mask: expected a bool or 0/1 array .*; got lists of different lengths: source_mask\[1\] "
                    r"has 1 item where source_mask\[0\] has 2 items"),
    (1, r"source_mask: expected shape \(2, 2\) or \(2, 1, 2\) to match source, got an int \(1\)$"),
    (np.array([[[1, 1]], [[0, 0]]]), r"item 1 has none"),
])
def test_bad_masks_are_refused(dot, mask, match):
    with pytest.raises(InputError, match=match):
        dot.predict(source_batch(2, 2), source_mask=mask)


def test_a_missing_mask_is_one_shared_read_only_array_for_small_shapes(dot):
    """No source_mask: small calls share one all-True mask per shape (no array made per call), which no one can
    write through; large ones get a fresh one (a shared mask would hold their memory)."""
    source = source_batch(2, 3)
    first = check_mask(None, source)
    assert first is check_mask(None, source) and not first.flags.writeable and first.all()
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0, 0] = False
    with pytest.raises(ValueError, match="WRITEABLE"):  # nor made writeable again: it lies over immutable bytes
        first.flags.writeable = True
    big = np.zeros((2, SHARED_MASK_SIZE, 2), np.float32)
    assert check_mask(None, big).flags.writeable
    np.testing.assert_array_equal(dot.predict(source), dot.predict(source, source_mask=np.ones((2, 3), bool)))


def test_both_infinities_in_a_source_are_refused_without_a_warning(dot):
    source = source_batch(1, 3)
    source[0, 0, 0], source[0, 1, 1] = np.inf, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match="expected finite values"):
            dot.predict(source)


def test_int_float_and_2d_masks_equal_bool_mask(dot):
    source = source_batch(2, 3)
    mask = np.array([[[1, 1, 0]], [[1, 1, 1]]])
    expected = dot.predict(source, source_mask=mask.astype(bool))
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask), expected)
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask[:, 0]), expected)
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask.astype(np.float32)), expected)
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask.tolist()), expected)
    np.testing.assert_array_equal(dot.predict(source, source_mask=(mask * 1.0).tolist()), expected)  # JSON 1.0


def test_float64_and_non_contiguous_sources_are_accepted(dot):
    source = source_batch(4, 3)
    expected = dot.predict(source)
    np.testing.assert_array_equal(dot.predict(source.astype(np.float64)), expected)
    wide = np.zeros((4, 3, 4), np.float32)
    wide[:, :, ::2] = source
    assert not wide[:, :, ::2].flags.c_contiguous
    np.testing.assert_array_equal(dot.predict(wide[:, :, ::2]), expected)
    np.testing.assert_array_equal(dot.predict(source.tolist()), expected)


def test_batch_zero_returns_empty_results(exports):
    for kind, exported in exports.items():
        out, alphas = Seq2Seq.load(exported.path).predict(np.zeros((0, 3, 2), np.float32), 4, return_attention=True)
        assert out.shape == (0, 4, 2) and out.dtype == np.float32
        heads = (3,) if kind == "multihead" else ()
        assert (alphas is None) if kind == "none" else alphas.shape == (0, *heads, 4, 3)


def test_shapes_of_outputs_and_attention(exports):
    for kind, exported in exports.items():
        out, alphas = Seq2Seq.load(exported.path).predict(source_batch(3, 5), 7, return_attention=True)
        assert out.shape == (3, 7, 2)
        if kind == "dot":
            assert alphas.shape == (3, 7, 5)
        elif kind == "multihead":
            assert alphas.shape == (3, 3, 7, 5)
        if alphas is not None:
            np.testing.assert_allclose(alphas.sum(axis=-1), 1.0, atol=1e-5)


# ---- services ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_sixteen_threads_match_sequential_calls(exports, device):
    model = Seq2Seq.load(exports["multihead"].path, provider=device)
    jobs = [(source_batch(1 + i % 5, 1 + i % 6, seed=i), 1 + i % 9) for i in range(64)]
    sequential = [model.predict(s, t, return_attention=True) for s, t in jobs]
    with ThreadPoolExecutor(max_workers=16) as pool:
        threaded = list(pool.map(lambda job: model.predict(job[0], job[1], return_attention=True), jobs))
    for (a, aa), (b, bb) in zip(sequential, threaded):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(aa, bb)


def test_a_bad_request_does_not_break_the_model(dot):
    good = dot.predict(source_batch(2, 2))
    with pytest.raises(InputError):
        dot.predict(np.full((2, 2, 2), np.nan))
    np.testing.assert_array_equal(dot.predict(source_batch(2, 2)), good)


def test_runtime_never_imports_torch(exports, python):
    code = (
        "import sys, numpy as np\n"
        "from runtime import Seq2Seq\n"
        f"m = Seq2Seq.load({str(exports['dot'].path)!r})\n"
        "out, a = m.predict(np.zeros((2, 3, 2), np.float32), 4, return_attention=True)\n"
        "assert out.shape == (2, 4, 2) and a.shape == (2, 4, 3)\n"
        "from cli.main import main\n"
        "import cli.infer\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'training', 'export'))\n"
        "print('LEAKED', bad)\n"
    )
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "LEAKED []" in result.stdout


def test_shipped_squares_model_completes_the_square():
    """The quickstart's model: intact, and it predicts the two corners that close each square."""
    from pathlib import Path

    model = Seq2Seq.load(Path(__file__).resolve().parents[1] / "artifacts" / "squares", provider="cpu")
    corners = np.array([[-1, -1], [-1, 1], [1, 1], [1, -1]], np.float32)
    sources, targets = [], []
    for start in range(4):
        for step in (1, -1):  # clockwise and counter-clockwise
            square = corners[[(start + step * i) % 4 for i in range(4)]]
            sources.append(square[:2])
            targets.append(square[2:])
    out, alphas = model.predict(np.stack(sources), return_attention=True)
    np.testing.assert_allclose(out, np.stack(targets), atol=0.25)  # test MSE is 0.011: about 0.1 per coordinate
    assert alphas.shape == (8, 2, 2)


@pytest.mark.parametrize(("source", "hint"), [(np.zeros((2, 2)), True), (np.zeros((1, 0)), False),
                                              (np.zeros((3, 5)), False)])
def test_a_batch_axis_is_suggested_only_for_one_source_of_points(source, hint):
    """(L, F) is one source without its batch axis; (1, 0) or (3, 5) is not, and adding an axis would not help."""
    from pathlib import Path

    model = Seq2Seq.load(Path(__file__).resolve().parents[1] / "artifacts" / "squares", provider="cpu")
    with pytest.raises(InputError, match=r"expected shape \(batch, source_len, 2\)") as caught:
        model.predict(source)
    assert ("needs a batch axis: (1, L, 2)" in str(caught.value)) == hint


@pytest.mark.parametrize("fused", [True, False], ids=["greedy loop graph", "step loop"])
def test_a_cancel_already_set_stops_a_point_decode_before_its_encoder_runs(fused):
    """`predict` asked `cancel` first at its first step (or before its loop graph), after the encoder had run
    whole: it is now asked before the encoder, as a token decode's is."""
    from pathlib import Path

    from runtime.errors import Cancelled

    model = Seq2Seq.load(Path(__file__).resolve().parents[1] / "artifacts" / "squares", provider="cpu", fused=fused)
    ran: list[int] = []
    name = "_encode" if fused else "run_encoder"  # the fused path's runner; the step loop's replaceable one
    encoder = getattr(model, name)
    setattr(model, name, lambda *args: ran.append(1) or encoder(*args))  # a witness: it runs the real session
    with pytest.raises(Cancelled, match=r"^decode: cancelled by its caller before it started"):
        model.predict(np.ones((3, 2, 2), np.float32), cancel=lambda: True)
    assert not ran
    assert model.predict(np.ones((1, 2, 2), np.float32)).shape == (1, 2, 2) and ran == [1]  # the witness works
