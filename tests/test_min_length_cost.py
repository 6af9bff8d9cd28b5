"""The eos rule below min_length costs a loop graph O(max_length + vocabulary) a call: no tensor of max_length x
vocabulary values, which a 32000-token vocabulary at max_length 256 made 33 MB a call (34-46 ms in the one-call
graphs, whose sessions run without the arena). Checked on what onnxruntime's profiler says every kernel wrote, in
every loop graph: the traced greedy loop (a GRU and a transformer) and the transformer's one-call graphs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from runtime.contract import FAST_FILES
from runtime.vocab import EOS

MAX_LENGTH = 7  # no other axis of these calls has this size (batch 2, beam 2, 3 source tokens, 14 target ids)
BATCH, BEAM, SOURCE = 2, 2, 3


def _sources() -> dict[str, np.ndarray]:
    ids = np.array([[5, 6, EOS], [7, EOS, 0]], np.int64)
    return {"source_ids": ids, "source_lengths": np.array([SOURCE, 2], np.int64)}


def _feed(export: Path, graph: str, names: list[str]) -> dict[str, np.ndarray]:
    """The graph's inputs: sources (the traced loop: the encoder's outputs for them) and the decoding options."""
    values = {**_sources(), "max_length": np.array(MAX_LENGTH), "min_length": np.array(3),
              "beam_size": np.array(BEAM), "num_hypotheses": np.array(1), "length_penalty": np.array(1.0)}
    if graph == "greedy_loop.onnx":
        encoder = ort.InferenceSession(str(export / "encoder.onnx"), providers=["CPUExecutionProvider"])
        feed = {i.name: values[i.name] for i in encoder.get_inputs()}
        values.update(zip([o.name for o in encoder.get_outputs()], encoder.run(None, feed)))
    return {name: values[name] for name in names}


def _written_shapes(export: Path, graph: str, profile_dir: Path) -> list[list[int]]:
    """The shape of every tensor a kernel wrote in one run of `graph` (loop bodies' kernels included)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(profile_dir / graph)
    session = ort.InferenceSession(str(export / graph), options, providers=["CPUExecutionProvider"])
    session.run(None, _feed(export, graph, [i.name for i in session.get_inputs()]))
    events = json.loads(Path(session.end_profiling()).read_text())
    return [shape for event in events if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
            for output in event["args"].get("output_type_shape", []) for shape in output.values()]


def _loop_graphs(export: Path) -> list[str]:
    return ["greedy_loop.onnx"] + sorted(f for role, f in FAST_FILES.items()
                                         if (export / f).exists() and "step" not in role and role != "encoder")


@pytest.mark.parametrize("which", ["transformer", "recurrent"])
def test_no_loop_graph_writes_a_max_length_by_vocabulary_tensor(request, which, tmp_path):
    export = request.getfixturevalue(f"{which}_export").path
    vocabulary = len(json.loads((export / "target_vocab.json").read_text())["tokens"])
    graphs = _loop_graphs(export)
    assert len(graphs) == (8 if which == "transformer" else 1), graphs  # every loop graph of the export is read
    for graph in graphs:
        shapes = _written_shapes(export, graph, tmp_path)
        # the check can see both axes: a step's log-probs span the vocabulary, the scanned tokens max_length
        assert any(vocabulary in shape for shape in shapes), graph
        assert any(MAX_LENGTH in shape for shape in shapes), graph
        both = [shape for shape in shapes if MAX_LENGTH in shape and vocabulary in shape]
        assert not both, f"{graph} wrote {both}: O(max_length x vocabulary) a call"
