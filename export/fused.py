"""The greedy loop graph: the exported decoder step wrapped, node for node, in an ONNX `Loop` (or a `Scan`).

The step graph's nodes and weights become the loop body unchanged (names prefixed `step/`), so the loop computes
exactly what the runtime's step loop computes, without one `run()` call per output. State that changes every step
(the previous output or token, hidden/cell, a transformer's positions and cache) is loop-carried; state that does
not (attention keys and values, the source mask) is read from the outer graph by name. What differs by model kind
(what is carried, the body's own nodes, the length input and the scan shapes) is a `LoopKind`: `export.points.loop`
runs exactly target_len steps, as a `Scan` (`export.scan_steps`: a step costs less than in a Loop);
`export.tokens.loop` picks the argmax in the body (ties: the lowest id, as numpy), forbids eos below `min_length`,
and stops once every row has emitted eos.

Scan outputs are stacked on a new leading axis (decode_len, batch, ...), reshaped to shapes taken from the inputs
and transposed to batch-first after the loop. A zero-trip Loop's scan outputs have no shape runtimes agree on
(onnxruntime gives (0, 0, ...)); the reshape makes a length of 0 return (batch, 0, ...) as declared. The runtime
itself never asks for fewer than one step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.contract import (
    DECODER_STEP_FILE,
    GREEDY_FILE,
    Dims,
)

from .errors import ExportError
from .graph_nodes import all_nodes, subgraphs
from .scan_steps import fixed_steps

PREFIX = "step/"
LOOP = "loop/"
Shapes = dict[str, tuple[list[str], list[int]]]  # scan output -> (its dims after decode_len, the batch-first perm)


@dataclass(frozen=True)
class LoopKind:
    """What one model kind puts in the loop (`export.points.loop`, `export.tokens.loop`): the graph's declared I/O,
    which step inputs are carried, the body around the step's nodes, and the outer graph's length input, first
    values and scan shapes. Each reads `decl`, what the kind is declared by: a point model's spec, a token model's
    contract (runtime.declared)."""

    io: Callable[[Any], dict[str, dict[str, Dims]]]
    carried: Callable[[set[str], Any], set[str]]
    body: Callable[[onnx.GraphProto, dict[str, str], Any], tuple[onnx.GraphProto, list[str]]]
    outer: Callable[[list[onnx.NodeProto], list[TensorProto], Any, list[str]], tuple[str, list[str], Shapes]]
    # After the loop: the batch-first outputs {name: value} -> the values the graph outputs (default: as they are).
    finish: Callable[[list[onnx.NodeProto], list[TensorProto], dict[str, str], Any], dict[str, str]] | None = None
    # Exactly `length` steps, never fewer: run as a Scan (export.scan_steps), which costs less a step than a Loop.
    fixed: bool = False


def graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value, initializer and node name of a graph and of the subgraphs its nodes hold (If branches)."""
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]} | {t.name for t in graph.initializer}
    for node in graph.node:
        names |= {*node.input, *node.output}
        for sub in subgraphs(node):
            names |= graph_names(sub)
    return names


def rename_step(graph: onnx.GraphProto, outer: set[str]) -> dict[str, str]:
    """The step graph's names in the body: inputs in `outer` keep theirs (read from the outer scope); every other
    value, initializer and node gets PREFIX, so nothing clashes with the outer graph."""
    return {n: n if n in outer or n == "" else PREFIX + n for n in graph_names(graph)}


def renamed(graph: onnx.GraphProto, rename: dict[str, str]) -> onnx.GraphProto:
    """A copy of `graph` with every name mapped, subgraphs included (names are unique across scopes)."""
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    _rename_in_place(copy, rename)
    return copy


def _rename_in_place(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    for value in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
        value.name = rename[value.name]
    for node in graph.node:
        node.name = PREFIX + node.name
        node.input[:] = [rename[n] for n in node.input]
        node.output[:] = [rename[n] for n in node.output]
        for sub in subgraphs(node):
            _rename_in_place(sub, rename)


def body_nodes(graph: onnx.GraphProto, rename: dict[str, str]) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """The step's nodes and initializers under their body names."""
    copy = renamed(graph, rename)
    return list(copy.node), list(copy.initializer)


def elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element type of each graph input and output, by name."""
    return {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}


def value(name: str, elem_type: int, shape: list | None = None) -> onnx.ValueInfoProto:
    """A typed value; shape None leaves it unknown (loop-carried caches change length every step)."""
    return helper.make_tensor_value_info(name, elem_type, shape)


def const(name: str, array: np.ndarray) -> TensorProto:
    """An initializer from a numpy array."""
    return numpy_helper.from_array(array, name)


def dim(nodes: list[onnx.NodeProto], weights: list[TensorProto], source: str, axis: int) -> str:
    """A 1-D int64 tensor holding source.shape[axis] (appends the nodes that compute it)."""
    out = f"{LOOP}{source}_dim{axis}"
    weights.append(const(out + "_index", np.array([axis], np.int64)))
    nodes += [helper.make_node("Shape", [source], [out + "_shape"]),
              helper.make_node("Gather", [out + "_shape", out + "_index"], [out], axis=0)]
    return out


def batch_first(nodes: list[onnx.NodeProto], weights: list[TensorProto], scan: str, out: str, dims: list[str],
                perm: list[int]) -> None:
    """A stacked scan output (decode_len, batch, [1,] ...) -> reshaped to (decode_len, *dims) and transposed by
    `perm`. The shape comes from the inputs, not from the scan: a zero-trip loop's scan output is (0, 0, ...) in
    onnxruntime, and this makes it (batch, 0, ...) as declared."""
    steps = dim(nodes, weights, scan, 0)
    nodes += [helper.make_node("Concat", [steps, *dims], [scan + "_shape"], axis=0),
              helper.make_node("Reshape", [scan, scan + "_shape"], [scan + "_flat"]),
              helper.make_node("Transpose", [scan + "_flat"], [out], perm=perm)]


def _constant(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """The value of an initializer or Constant node output `name` in `graph`, or None."""
    for tensor in graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
    return None


def squeeze_carried(body: onnx.GraphProto, carried: int) -> dict[int, int]:
    """Carried values the body reads only as x[.., 0, ..] (one Gather of index 0) and feeds back as Unsqueeze(y)
    on that axis (a GRU's (layers=1, N, H) hidden state, a point model's (N, 1, F) previous output): carry y
    instead, so the two nodes leave the body (each is a kernel dispatch every step). Scans that read the
    Unsqueeze's output read y (the outer graph reshapes every scan from the inputs' dims). Rewrites `body` in
    place; returns {carried index: axis}, for the outer graph to take x[.., 0, ..] of the first values."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in body.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producers = {name: node for node in body.node for name in node.output}
    squeezed: dict[int, int] = {}
    for i in range(carried):
        x, fed = body.input[2 + i].name, body.output[1 + i].name
        users, unsqueeze = consumers.get(x, []), producers.get(fed)
        if len(users) != 1 or users[0].op_type != "Gather" or unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
            continue
        gather = users[0]
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        index, axes = _constant(body, gather.input[1]), _constant(body, unsqueeze.input[1])
        if gather.input[0] != x or index is None or index.shape != () or int(index) != 0 or axes is None \
                or axes.tolist() != [axis]:
            continue
        narrow = unsqueeze.input[0]
        for node in consumers.get(gather.output[0], []):  # they read the carried value itself now
            node.input[:] = [x if name == gather.output[0] else name for name in node.input]
        scans = [node for node in consumers.get(fed, []) if node.op_type == "Identity"]
        for node in scans:  # a scan of the fed-back value reads it as carried
            node.input[0] = narrow
        body.output[1 + i].name = narrow
        body.output[1 + i].type.tensor_type.ClearField("shape")
        body.node.remove(gather)
        if len(scans) == len(consumers.get(fed, [])) and fed not in {o.name for o in body.output}:
            body.node.remove(unsqueeze)
        squeezed[i] = axis
    _drop_unread(body)
    return squeezed


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove the initializers and Constant nodes no node or output of `graph` reads (the index and axes of the
    nodes squeeze_carried took out; onnxruntime would warn of each at every session it opens). One pass: a Constant
    reads nothing, so removing one leaves nothing else unread."""
    read = {name for node in all_nodes(graph) for name in node.input} | {o.name for o in graph.output}
    for node in [n for n in graph.node if n.op_type == "Constant" and n.output[0] not in read]:
        graph.node.remove(node)
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def outer_graph(body: onnx.GraphProto, carried: list[str], step: onnx.GraphProto, decl: Any,
                loop: LoopKind) -> onnx.GraphProto:
    """Inputs as the contract declares, the Loop, and its scan outputs made batch-first."""
    io = loop.io(decl)
    types = elem_types(step)
    inputs = [value(name, types.get(name, TensorProto.INT64), dims) for name, dims in io["inputs"].items()]
    outputs = [value(name, TensorProto.INT64 if name == "tokens" else TensorProto.FLOAT, dims)
               for name, dims in io["outputs"].items()]
    weights = [] if loop.fixed else [const(LOOP + "true", np.array(True))]
    nodes: list[onnx.NodeProto] = []
    length, initial, shapes = loop.outer(nodes, weights, decl, carried)
    squeezed = squeeze_carried(body, len(initial))
    if squeezed:
        weights.append(const(LOOP + "index_0", np.array(0, np.int64)))
    for i, axis in squeezed.items():  # the first value as the body now carries it
        nodes.append(helper.make_node("Gather", [initial[i], LOOP + "index_0"], [f"{initial[i]}_narrow"],
                                      axis=axis))
        initial[i] = f"{initial[i]}_narrow"
    finals = [f"{LOOP}final_{name}" for name in carried]
    scan_names = {name: f"{LOOP}stacked_{name}" for name in io["outputs"]}
    if loop.fixed:
        fixed_steps(nodes, weights, length, initial, finals, list(scan_names.values()), body, LOOP + "scan/")
    else:
        nodes.append(helper.make_node("Loop", [length, LOOP + "true", *initial], [*finals, *scan_names.values()],
                                      name=LOOP + "greedy", body=body))
    first = {name: name if loop.finish is None else f"{LOOP}batch_first_{name}" for name in io["outputs"]}
    for name in io["outputs"]:
        batch_first(nodes, weights, scan_names[name], first[name], *shapes[name])
    if loop.finish is not None:
        for name, produced in loop.finish(nodes, weights, first, decl).items():
            nodes.append(helper.make_node("Identity", [produced], [name]))
    for i, node in enumerate(nodes):
        node.name = node.name or f"{LOOP}outer{i}"
    return helper.make_graph(nodes, "seq2onnx_greedy_loop", inputs, outputs, initializer=weights)


def build_greedy_graph(step_path: Path, decl: Any, loop: LoopKind) -> onnx.ModelProto:
    """The greedy loop model around the step graph at `step_path` (metadata and checks: graphs.finish_graph)."""
    step = onnx.load(str(step_path))
    io = loop.io(decl)
    step_inputs = {v.name for v in step.graph.input}
    outer = step_inputs - loop.carried(step_inputs, decl)
    missing = sorted(outer - set(io["inputs"]))
    if missing:
        raise ExportError(f"{DECODER_STEP_FILE}: inputs {missing} are neither loop-carried nor greedy loop inputs")
    rename = rename_step(step.graph, outer)
    body, carried = loop.body(step.graph, rename, decl)
    graph = outer_graph(body, carried, step.graph, decl, loop)
    model = helper.make_model(graph, opset_imports=list(step.opset_import), producer_name=step.producer_name,
                              producer_version=step.producer_version)
    model.ir_version = step.ir_version
    return model


def write_greedy_graph(out_dir: Path, decl: Any, loop: LoopKind) -> Path:
    """Build the greedy loop from out_dir's step graph and save it beside it (unchecked; see graphs.finish_graph)."""
    path = out_dir / GREEDY_FILE
    onnx.save(build_greedy_graph(out_dir / DECODER_STEP_FILE, decl, loop), str(path))
    return path
