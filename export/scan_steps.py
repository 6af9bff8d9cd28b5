"""A decode of exactly T steps (a point model's greedy loop) as an ONNX `Scan` instead of a `Loop`.

onnxruntime's Loop makes a step's iteration number and condition, allocates every scanned value of every step, keeps
them all and concatenates them after the last step; its Scan writes each step's scanned values straight into the
stacked output. At one row that is a large share of a step: bare graphs of 100 steps, 1 thread, on an AMD EPYC Zen 4
(`/tmp` scratch script, two runs), a body of three small kernels scanning two values took 2.13 us a step in a Loop
(with the Identity that passes its condition on) and 1.08 in a Scan; a Loop scanning nothing, with one kernel more,
1.65. The point loops, the same checkpoints exported before and after (`benchmarks/loop_graph_ab.py`, both ways,
50-point sources, 100 steps; README, "The greedy loop graph"): the folded loop, hidden 64, 0.88x its Loop's time at
batch 1, ~0.97x at 16, ~0.98x at 64; the traced loop of a model without attention 0.94x at batch 1; outputs equal
bit for bit. A Scan cannot stop early, so the token models' loops, which stop once every row has emitted </s>, keep
their Loop.

onnxruntime refuses a Scan over no steps (its slicer's "Invalid dim0_offset of 0"), so the Scan runs max(T, 1)
steps: the stacked values are cut to T rows and, for T = 0, the carried values' last values are their first, as a
zero-trip Loop's are: six kernels a call besides the steps, a Where for each carried value and a Slice for each
scanned one, a few us in all.
"""
from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph_nodes import all_nodes


def scan_body(body: onnx.GraphProto, tick: str) -> onnx.GraphProto:
    """A copy of a Loop body (iteration, condition, *carried) -> (condition, *carried, *scanned) whose nodes read
    neither the iteration nor the condition, and which gives the condition back unchanged, as a Scan body
    (*carried, tick) -> (*carried, *scanned); `tick` is the scanned input it reads nothing from."""
    iteration, condition = body.input[0].name, body.input[1].name
    read = {name for node in all_nodes(body) for name in node.input}
    if {iteration, condition} & read or body.output[0].name != condition:
        raise ValueError(f"loop body {body.name!r} reads its iteration or condition, or changes the condition: "
                         "its steps cannot be a Scan's")
    scan = copy.deepcopy(body)
    inputs, outputs = list(scan.input[2:]), list(scan.output[1:])
    del scan.input[:], scan.output[:]
    scan.input.extend([*inputs, helper.make_tensor_value_info(tick, TensorProto.FLOAT, [1])])
    scan.output.extend(outputs)
    return scan


def fixed_steps(nodes: list[onnx.NodeProto], weights: list[TensorProto], length: str, initial: list[str],
                finals: list[str], stacked: list[str], body: onnx.GraphProto, prefix: str) -> None:
    """Append the nodes that run the Loop body `body` (see scan_body) exactly `length` times (a scalar int64 >= 0)
    from the carried values `initial`, naming the carried values' last values `finals` and the stacked scanned
    values (length, ...) `stacked`, as Loop(length, true, *initial) would; every other name starts with `prefix`."""
    p = prefix
    weights += [numpy_helper.from_array(np.array([1], np.int64), p + "one"),
                numpy_helper.from_array(np.array([0], np.int64), p + "zero"),
                numpy_helper.from_array(np.array(0, np.int64), p + "none")]
    ran_finals, ran_stacked = [f"{p}ran_{name}" for name in finals], [f"{p}ran_{name}" for name in stacked]
    zero = helper.make_tensor(p + "tick_value", TensorProto.FLOAT, [1], [0.0])
    new = [helper.make_node("Reshape", [length, p + "one"], [p + "steps"]),  # (1,): [T]
           helper.make_node("Max", [p + "steps", p + "one"], [p + "runs"]),  # max(T, 1)
           helper.make_node("Concat", [p + "runs", p + "one"], [p + "ticks_shape"], axis=0),
           helper.make_node("ConstantOfShape", [p + "ticks_shape"], [p + "ticks"], value=zero),
           helper.make_node("Scan", [*initial, p + "ticks"], [*ran_finals, *ran_stacked],
                            body=scan_body(body, p + "tick"), num_scan_inputs=1),
           helper.make_node("Greater", [length, p + "none"], [p + "any"])]
    new += [helper.make_node("Where", [p + "any", ran, first], [final])
            for ran, first, final in zip(ran_finals, initial, finals, strict=True)]
    new += [helper.make_node("Slice", [ran, p + "zero", p + "steps", p + "zero"], [out])
            for ran, out in zip(ran_stacked, stacked, strict=True)]
    for node in new:
        node.name = f"{p}{node.op_type}_{node.output[0]}"
    nodes += new

