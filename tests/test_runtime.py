"""Runtime: load-time integrity, strict inputs, providers, threads, and no torch."""
from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import DEVICES, source_batch

from runtime import Seq2Seq
from runtime.contract import DECODER_STEP_FILE, ENCODER_FILE, MANIFEST_FILE
from runtime.errors import IntegrityError, InputError, ManifestError, ProviderError
from runtime.inputs import MAX_TARGET_LEN
from runtime.manifest import sha256_file


@pytest.fixture
def copy_of(tmp_path, exports):
    """A private copy of the dot-attention export, safe to damage."""
    dest = tmp_path / "model"
    shutil.copytree(exports["dot"].path, dest)
    return dest


@pytest.fixture(scope="module")
def dot(exports):
    return Seq2Seq.load(exports["dot"].path, provider="cpu")


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
    with pytest.raises(ManifestError, match=r"format_version 99 .* understood versions: \[1\]"):
        Seq2Seq.load(copy_of)


def test_malformed_manifest_is_a_manifest_error(copy_of):
    (copy_of / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Seq2Seq.load(copy_of)


def test_manifest_spec_that_disagrees_with_the_graphs_is_refused(copy_of):
    manifest = json.loads((copy_of / MANIFEST_FILE).read_text())
    edit_manifest(copy_of, spec={**manifest["spec"], "hidden_dim": 7})
    with pytest.raises(ManifestError, match="does not match the spec"):
        Seq2Seq.load(copy_of)


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
    with pytest.raises(ProviderError, match="expected one of"):
        Seq2Seq.load(exports["dot"].path, provider="tpu")


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA really works here")
def test_cuda_without_cuda_is_an_error_naming_what_is_missing(exports):
    with pytest.raises(ProviderError, match="provider 'cuda'"):
        Seq2Seq.load(exports["dot"].path, provider="cuda")


def test_auto_reports_the_providers_it_got(exports):
    model = Seq2Seq.load(exports["dot"].path, provider="auto")
    expected = "CUDAExecutionProvider" if "cuda" in DEVICES else "CPUExecutionProvider"
    assert model.providers[0] == expected
    assert model.spec == exports["dot"].spec


# ---- inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,match", [
    (np.zeros((3, 2), np.float32), r"source: expected shape \(batch, source_len, 2\).*source\[None\]"),
    (np.zeros((1, 2, 3), np.float32), r"source: expected shape .* got shape \(1, 2, 3\)"),
    (np.zeros((1, 0, 2), np.float32), r"source_len >= 1"),
    (np.zeros((1, 2, 2), np.int64), r"source: expected floating-point .* int64"),
    (np.array([[[1.0, "a"]]], dtype=object), r"source: expected floating-point .* object"),
    (np.array([[["1", "2"]]]), r"source: expected floating-point"),
    ([[[1.0, 2.0], [3.0]]], r"source: expected a numeric array"),
    (np.array([[[0.0, 1.0]], [[np.nan, 0.0]]], np.float32), r"NaN or Inf \(first in batch item 1\)"),
    (np.array([[[np.inf, 1.0]]]), r"NaN or Inf"),
])
def test_bad_sources_are_refused_by_name(dot, bad, match):
    with pytest.raises(InputError, match=match):
        dot.predict(bad)


@pytest.mark.parametrize("bad", [0, -1, MAX_TARGET_LEN + 1, 2.5, True, "3"])
def test_bad_target_len_is_refused(dot, bad):
    with pytest.raises(InputError, match="target_len: expected an int"):
        dot.predict(source_batch(1, 2), target_len=bad)


@pytest.mark.parametrize("mask,match", [
    (np.ones((2, 1, 3), bool), r"source_mask: expected shape \(2, 1, 2\)"),
    (np.ones((2, 1, 2), np.float32), r"source_mask: expected bool or 0/1 integers"),
    (np.full((2, 1, 2), 2, np.int64), r"only 0 and 1"),
    (np.array([[[1, 1]], [[0, 0]]]), r"item 1 has none"),
])
def test_bad_masks_are_refused(dot, mask, match):
    with pytest.raises(InputError, match=match):
        dot.predict(source_batch(2, 2), source_mask=mask)


def test_int_mask_and_2d_mask_equal_bool_mask(dot):
    source = source_batch(2, 3)
    mask = np.array([[[1, 1, 0]], [[1, 1, 1]]])
    expected = dot.predict(source, source_mask=mask.astype(bool))
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask), expected)
    np.testing.assert_array_equal(dot.predict(source, source_mask=mask[:, 0]), expected)


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
        "from runtime.cli import main\n"
        "import runtime.infer_cli\n"
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
