"""Hostile artifacts: a model directory written by someone else is refused, and nothing outside it is read."""
from __future__ import annotations

import builtins
import io
import json
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runtime import Seq2Seq
from runtime.contract import DECODER_STEP_FILE, ENCODER_FILE, MANIFEST_FILE
from runtime.errors import IntegrityError, ManifestError
from runtime.manifest import MAX_MANIFEST_BYTES
from runtime.model_files import sha256_file
from runtime.sessions import external_tensor, read_graph

LOAD_SECONDS = 30  # a load that blocks (on a FIFO, say) fails after this instead of hanging the suite
JSON_DEPTH = 100_000  # far beyond the json module's recursion limit


@pytest.fixture
def model(tmp_path, exports) -> Path:
    """A private copy of the dot-attention export; tmp_path/'outside' is the rest of the disk."""
    (tmp_path / "outside").mkdir()
    return Path(shutil.copytree(exports["dot"].path, tmp_path / "model"))


@pytest.fixture
def opened(monkeypatch) -> list[Path]:
    """Every path opened through Python's os.open / open, links resolved; tests clear it once set up."""
    seen: list[Path] = []

    def spy(real):
        def wrapper(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)):
                seen.append(Path(path).resolve())
            return real(path, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "open", spy(os.open))
    monkeypatch.setattr(builtins, "open", spy(builtins.open))
    monkeypatch.setattr(io, "open", spy(io.open))
    return seen


def assert_only_inside(opened: list[Path], model: Path) -> None:
    """Nothing outside the model directory was opened."""
    outside = [p for p in opened if model.resolve() not in p.parents]
    assert outside == []


def edit_entry(model: Path, name: str, **changes) -> None:
    """Change fields of one graph's manifest entry."""
    manifest = json.loads((model / MANIFEST_FILE).read_text())
    manifest["graphs"][name].update(changes)
    (model / MANIFEST_FILE).write_text(json.dumps(manifest))


def load_within(path: Path, seconds: float = LOAD_SECONDS) -> BaseException | None:
    """Seq2Seq.load in a daemon thread: the exception it raised, None if it loaded; fails if it blocks."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            Seq2Seq.load(path, provider="cpu")
            outcome.append(None)
        except BaseException as exc:  # handed back to the test, which asserts on its type
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"Seq2Seq.load blocked for {seconds} s"
    return outcome[0]


# ---- manifest 'file' fields ------------------------------------------------------------------

@pytest.mark.parametrize("file,reason", [
    ("../x.onnx", "contains '..'"),
    ("sub/encoder.onnx", "contains a path separator"),
    ("decoder_step.onnx", "is another file than this entry's"),  # (it said "the graph's name", of vocabularies too)
    ("ABSOLUTE", "is an absolute path"),
])
def test_a_file_field_that_leaves_the_directory_is_refused(model, opened, file, reason):
    outside = model.parent / "outside" / ENCODER_FILE
    shutil.copy(model / ENCODER_FILE, outside)  # the right bytes, in the wrong place
    shutil.copy(model / ENCODER_FILE, model.parent / "x.onnx")
    file = str(outside) if file == "ABSOLUTE" else file
    edit_entry(model, ENCODER_FILE, file=file)
    opened.clear()
    message = f"['file'] is '{file}', which {reason}; expected 'encoder.onnx'"
    with pytest.raises(ManifestError, match=re.escape(message)):
        Seq2Seq.load(model)
    assert_only_inside(opened, model)


# ---- links and special files -----------------------------------------------------------------

def test_a_graph_that_is_a_link_elsewhere_is_refused_even_with_the_right_bytes(model, opened):
    outside = model.parent / "outside" / ENCODER_FILE
    shutil.move(model / ENCODER_FILE, outside)
    (model / ENCODER_FILE).symlink_to(outside)
    opened.clear()
    with pytest.raises(IntegrityError, match=r"encoder.onnx: is a symbolic link"):
        Seq2Seq.load(model)
    assert_only_inside(opened, model)


def test_a_graph_that_is_a_link_inside_the_directory_is_refused(model):
    shutil.move(model / ENCODER_FILE, model / "real.onnx")
    (model / ENCODER_FILE).symlink_to("real.onnx")
    with pytest.raises(IntegrityError, match="is a symbolic link"):
        Seq2Seq.load(model)


def test_a_manifest_that_is_a_link_is_refused(model, opened):
    outside = model.parent / "outside" / MANIFEST_FILE
    shutil.move(model / MANIFEST_FILE, outside)
    (model / MANIFEST_FILE).symlink_to(outside)
    opened.clear()
    with pytest.raises(ManifestError, match=r"manifest.json: is a symbolic link"):
        Seq2Seq.load(model)
    assert_only_inside(opened, model)


@pytest.mark.parametrize("name,error", [(MANIFEST_FILE, ManifestError), (ENCODER_FILE, IntegrityError)])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_special_files_are_refused_without_blocking(model, name, error, kind):
    (model / name).unlink()
    os.mkfifo(model / name) if kind == "fifo" else (model / name).mkdir()
    raised = load_within(model)
    assert isinstance(raised, error), raised
    assert "is not a regular file" in str(raised)


def test_a_graph_name_that_leaves_the_directory_is_refused(model):
    shutil.copy(model / ENCODER_FILE, model.parent / "x.onnx")
    with pytest.raises(IntegrityError, match="resolves outside the model directory"):
        read_graph(model, "../x.onnx", sha256_file(model / ENCODER_FILE))


# ---- size and nesting ------------------------------------------------------------------------

def test_an_enormous_manifest_is_refused(model):
    manifest = json.loads((model / MANIFEST_FILE).read_text())
    manifest["padding"] = "x" * MAX_MANIFEST_BYTES  # an ignored key: valid JSON, but no manifest is this big
    (model / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=rf"larger than the {MAX_MANIFEST_BYTES}-byte limit"):
        Seq2Seq.load(model)


def test_a_deeply_nested_manifest_is_refused(model):
    manifest = json.loads((model / MANIFEST_FILE).read_text())
    text = json.dumps(manifest)[:-1] + ', "deep": ' + "[" * JSON_DEPTH + "]" * JSON_DEPTH + "}"
    (model / MANIFEST_FILE).write_text(text)
    with pytest.raises(ManifestError, match="nested too deeply"):
        Seq2Seq.load(model)


# ---- external data ---------------------------------------------------------------------------

def externalize(model: Path, name: str, location: str, data_dir: Path) -> str:
    """Move a graph's largest initializer into data_dir/location, as external data; fix the manifest's sha."""
    graph = onnx.load(str(model / name))
    tensor = max(graph.graph.initializer, key=lambda t: len(t.raw_data))
    (data_dir / location).parent.mkdir(parents=True, exist_ok=True)
    (data_dir / location).write_bytes(tensor.raw_data)
    length = len(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": str(length)}.items():
        tensor.external_data.add(key=key, value=value)
    (model / name).write_bytes(graph.SerializeToString())
    edit_entry(model, name, sha256=sha256_file(model / name))
    return tensor.name


def test_external_data_in_the_working_directory_is_never_read(model, opened, monkeypatch):
    """onnxruntime 1.31 resolves external data of a graph given as bytes against the current directory and
    reads it: without the runtime's own check this model loads, with weights from a file outside the model."""
    cwd = model.parent / "outside"
    monkeypatch.chdir(cwd)
    name = externalize(model, DECODER_STEP_FILE, "weights.bin", cwd)
    opened.clear()
    message = f"tensor '{name}' (location 'weights.bin') keeps its data in an external file"
    with pytest.raises(IntegrityError, match=re.escape(message)):
        Seq2Seq.load(model)
    assert_only_inside(opened, model)
    import onnxruntime as ort  # the danger is real: onnxruntime itself reads weights.bin from the working directory

    ort.InferenceSession((model / DECODER_STEP_FILE).read_bytes(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("location", ["../outside/weights.bin", "weights.bin", "ABSOLUTE"])
def test_external_data_anywhere_is_refused_by_the_runtime_itself(model, location):
    location = str(model.parent / "outside" / "w.bin") if location == "ABSOLUTE" else location
    externalize(model, ENCODER_FILE, location, model)
    with pytest.raises(IntegrityError, match=r"keeps its data in an external file"):
        Seq2Seq.load(model)


def tiny_model(**where) -> onnx.ModelProto:
    """y = x + c, with c an external tensor placed as `where` says: initializer, sparse, constant or subgraph."""
    c = numpy_helper.from_array(np.ones(4, np.float32), "c")
    c.ClearField("raw_data")
    c.data_location = TensorProto.EXTERNAL
    c.external_data.add(key="location", value="c.bin")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    add = helper.make_node("Add", ["x", "c"], ["y"])
    if where.get("as") == "constant":
        nodes, inits, sparse = [helper.make_node("Constant", [], ["c"], value=c), add], [], []
    elif where.get("as") == "sparse":
        indices = numpy_helper.from_array(np.arange(4, dtype=np.int64), "i")
        nodes, inits, sparse = [add], [], [helper.make_sparse_tensor(c, indices, [4])]
    else:
        nodes, inits, sparse = [add], [c], []
    graph = helper.make_graph(nodes, "g", [x], [y], inits, sparse_initializer=sparse)
    if where.get("in") == "subgraph":
        cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
        branch = helper.make_graph(nodes, "then", [], [y], inits, sparse_initializer=sparse)
        plain = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "else", [], [y])
        node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=plain)
        graph = helper.make_graph([node], "g", [x, cond], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("place", ["initializer", "constant", "sparse"])
@pytest.mark.parametrize("depth", ["graph", "subgraph"])
def test_the_scanner_finds_external_tensors_wherever_they_are(place, depth):
    model = tiny_model(**{"as": place, "in": depth})
    assert external_tensor(model.SerializeToString()) == "tensor 'c' (location 'c.bin')"


def test_the_scanner_passes_inline_graphs(exports):
    for exported in exports.values():
        for name in (ENCODER_FILE, DECODER_STEP_FILE):
            assert external_tensor((exported.path / name).read_bytes()) is None


@pytest.mark.parametrize("data", [b"\x3a\xff\xff", b"\x3a\x10abc", b"\x0f", b"\x80" * 20])
def test_the_scanner_reports_malformed_protobuf(data):
    with pytest.raises(ValueError):
        external_tensor(data)
