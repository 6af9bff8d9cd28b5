"""A point model's exactly-T-steps decode runs in a Scan (export.scan_steps): the same outputs as the Loop it
replaces, bit for bit, at every length from 0 and every batch from 0, and a body the Scan cannot run is refused."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export.fused import build_greedy_graph
from export.kinds import KINDS as EXPORT_KINDS
from export.scan_steps import fixed_steps, scan_body
from runtime import Seq2Seq

from support.models import source_batch


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 1, 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def counting_body(reads: str = "h", condition_out: str = "cond") -> onnx.GraphProto:
    """A Loop body (iteration, condition, h) -> (condition, h + 1, scanned 2 h): `reads` is what the Add reads."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [helper.make_node("Add", [reads, "one"] if reads == "h" else ["h", "step"], ["h_next"]),
             helper.make_node("Add", ["h_next", "h_next"], ["twice"])]
    if reads != "h":  # the iteration number, as a float
        nodes.insert(0, helper.make_node("Cast", [reads], ["step"], to=TensorProto.FLOAT))
    value = helper.make_tensor_value_info
    return helper.make_graph(
        nodes, "counting",
        [value("i", TensorProto.INT64, []), value("cond", TensorProto.BOOL, []), value("h", TensorProto.FLOAT, [2])],
        [value(condition_out, TensorProto.BOOL, []), value("h_next", TensorProto.FLOAT, [2]),
         value("twice", TensorProto.FLOAT, [2])], [one])


def counting_model(scan: bool) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    weights = [helper.make_tensor("true", TensorProto.BOOL, [], [True])]
    if scan:
        fixed_steps(nodes, weights, "T", ["h0"], ["last"], ["stacked"], counting_body(), "scan/")
    else:
        nodes.append(helper.make_node("Loop", ["T", "true", "h0"], ["last", "stacked"], body=counting_body()))
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("T", TensorProto.INT64, []), value("h0", TensorProto.FLOAT, [2])],
                              [value("last", TensorProto.FLOAT, [2]), value("stacked", TensorProto.FLOAT, None)],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("steps", [0, 1, 2, 5])
def test_fixed_steps_give_what_a_loop_gives_the_carried_values_first_values_at_zero_steps(steps):
    """onnxruntime refuses a Scan over no steps, so the Scan runs max(T, 1) and the outputs are cut back: at T = 0
    the carried value's last value is its first, and nothing is stacked."""
    feed = {"T": np.array(steps, np.int64), "h0": np.array([0.5, -2.0], np.float32)}
    scan, loop = counting_model(True), counting_model(False)
    assert "Loop" not in {n.op_type for n in scan.graph.node} and "Scan" in {n.op_type for n in scan.graph.node}
    (last, stacked), (want_last, want_stacked) = session(scan).run(None, feed), session(loop).run(None, feed)
    np.testing.assert_array_equal(last, feed["h0"] + steps)
    np.testing.assert_array_equal(last, want_last)
    assert stacked.shape[0] == steps and want_stacked.shape[0] == steps
    np.testing.assert_array_equal(stacked.reshape(steps, 2), want_stacked.reshape(steps, 2))


@pytest.mark.parametrize("reads, condition_out", [("i", "cond"), ("h", "h_next")],
                         ids=["reads-its-iteration", "changes-its-condition"])
def test_a_body_that_needs_the_loops_own_values_is_refused(reads, condition_out):
    body = counting_body(reads, condition_out)
    with pytest.raises(ValueError, match="reads its iteration or condition, or changes the condition"):
        scan_body(body, "tick")


@pytest.mark.parametrize("kind", ["none", "dot", "multihead"])
def test_a_point_models_greedy_graph_is_a_scan_equal_to_the_loop_bit_for_bit(exports, kind):
    """The traced step in a Scan against the same step in a Loop, every output equal, batch and length 0 too."""
    exported = exports[kind]
    step, points = exported.path / "decoder_step.onnx", EXPORT_KINDS["points"].loop
    graphs = {fixed: build_greedy_graph(step, exported.spec, dataclasses.replace(points, fixed=fixed))
              for fixed in (True, False)}
    assert [[n.op_type for n in g.graph.node if n.op_type in ("Loop", "Scan")] for g in graphs.values()] == \
        [["Scan"], ["Loop"]]
    sessions = {fixed: session(g) for fixed, g in graphs.items()}
    runtime = Seq2Seq.load(exported.path, fused=False)
    for batch, steps in ((1, 9), (3, 17), (2, 0), (0, 3), (4, 1)):
        rows = max(batch, 1)  # encoded; the feed takes the first `batch`
        source, mask = source_batch(rows, 6, seed=batch + steps), np.ones((rows, 1, 6), bool)
        if batch >= 2:
            mask[-1, 0, 4:] = False  # a right-padded row
        states = runtime.run_encoder({"source": source, "source_mask": mask}) | {"source_mask": mask}
        states["decoder_input"] = source[:, -1:]
        feed = {i.name: (states[i.name][:, :batch] if i.name == "hidden" else states[i.name][:batch])
                for i in sessions[True].get_inputs() if i.name != "target_len"}
        feed["target_len"] = np.array(steps, np.int64)
        got, want = sessions[True].run(None, feed), sessions[False].run(None, feed)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and a.shape[0] == batch and steps in a.shape, (a.shape, b.shape)
            np.testing.assert_array_equal(a, b)
