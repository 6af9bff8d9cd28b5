"""The greedy loop graph of a point model (machinery: `export.fused`): carry the previous output and hidden state,
scan each step's output and attention, run exactly target_len steps."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.fused import LOOP, LoopKind, Shapes, body_nodes, const, dim, elem_types, value
from runtime.contract import point_greedy_io
from runtime.spec import ModelSpec

CARRIED = ("decoder_input", "hidden")


def carried(step_inputs: set[str], spec: ModelSpec) -> set[str]:
    """The step inputs the loop carries: the previous output and the hidden state."""
    return set(CARRIED)


def point_body(graph: onnx.GraphProto, rename: dict[str, str], spec: ModelSpec) -> tuple[onnx.GraphProto, list[str]]:
    """Points: carry (decoder_input, hidden), scan the step's output and alphas; the condition never changes."""
    types = elem_types(graph)
    carried = [("decoder_input", "output"), ("hidden", "hidden_out")]
    scans = ["output"] + (["alphas"] if spec.has_attention else [])
    nodes, weights = body_nodes(graph, rename)
    # Body outputs name the step's own values (every node in the body costs a dispatch per step); only `output`,
    # both carried and scanned, needs a second name. The condition passes through unchanged.
    nodes.append(helper.make_node("Identity", [rename["output"]], [LOOP + "scan_output"], name=LOOP + "scan_output"))
    outputs = [value(LOOP + "cond_in", TensorProto.BOOL, [])]
    outputs += [value(rename[produced], types[produced]) for _, produced in carried]
    outputs += [value(LOOP + "scan_output" if name == "output" else rename[name], types[name]) for name in scans]
    inputs = [value(LOOP + "iter", TensorProto.INT64, []), value(LOOP + "cond_in", TensorProto.BOOL, [])]
    inputs += [value(rename[fed], types[fed]) for fed, _ in carried]
    body = helper.make_graph(nodes, "greedy_body", inputs, outputs, initializer=weights)
    return body, [fed for fed, _ in carried]


def outer(nodes: list[onnx.NodeProto], weights: list[TensorProto], spec: ModelSpec,
          carried: list[str]) -> tuple[str, list[str], Shapes]:
    """The loop's length input (target_len), its carried values' first values (the encoder's), and the batch-first
    shape of each scan output: outputs (batch, decode_len, F), alphas (batch, [heads,] decode_len, source_len)."""
    batch = dim(nodes, weights, "decoder_input", 0)
    weights.append(const(LOOP + "features", np.array([spec.n_features], np.int64)))
    if spec.attention == "multihead":
        weights.append(const(LOOP + "heads", np.array([spec.n_heads], np.int64)))
    source_len = dim(nodes, weights, "source_mask", 2) if spec.has_attention else ""
    multihead = spec.attention == "multihead"
    shapes = {"outputs": ([batch, LOOP + "features"], [1, 0, 2]),
              "alphas": ([batch, LOOP + "heads", source_len], [1, 2, 0, 3]) if multihead
              else ([batch, source_len], [1, 0, 2])}
    return "target_len", list(carried), shapes


LOOP_KIND = LoopKind(point_greedy_io, carried, point_body, outer, fixed=True)
