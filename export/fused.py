"""The greedy loop graph: the exported decoder step wrapped, node for node, in an ONNX `Loop`.

The step graph's nodes and weights become the Loop body unchanged (names prefixed `step/`), so the loop computes
exactly what the runtime's step loop computes, without one `run()` call per output. State that changes every step
(the previous output or token, hidden/cell, a transformer's positions and cache) is loop-carried; state that does
not (attention keys and values, the source mask) is read from the outer graph by name. Token models pick the argmax
in the body (ties: the lowest id, as numpy), forbid eos below `min_length`, and stop once every row has emitted eos.

Scan outputs are stacked on a new leading axis (decode_len, batch, ...), reshaped to shapes taken from the inputs
and transposed to batch-first after the loop. A zero-trip Loop's scan outputs have no shape runtimes agree on
(onnxruntime gives (0, 0, ...)); the reshape makes a length of 0 return (batch, 0, ...) as declared. The runtime
itself never asks for fewer than one step.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.contract import (
    DECODER_STEP_FILE,
    FEEDBACK,
    GREEDY_FILE,
    greedy_io,
    state_batch_axes,
)
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS, PAD

from .errors import ExportError

PREFIX = "step/"
LOOP = "loop/"


def graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value, initializer and node name of a graph and of the subgraphs its nodes hold (If branches)."""
    names = {v.name for v in [*graph.input, *graph.output, *graph.value_info]} | {t.name for t in graph.initializer}
    for node in graph.node:
        names |= {*node.input, *node.output}
        for sub in subgraphs(node):
            names |= graph_names(sub)
    return names


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by a node's attributes."""
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


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


def token_body(graph: onnx.GraphProto, rename: dict[str, str], spec: ModelSpec) -> tuple[onnx.GraphProto, list[str]]:
    """Tokens: carry (previous_tokens, finished, fed-back state); pick the argmax, forbid eos below min_length, scan
    the chosen tokens, their log-probs and alphas, and continue while any row is live."""
    types = elem_types(graph)
    feedback = [(fed, out) for out, fed in FEEDBACK.items() if out in types and fed in types]
    nodes, weights = body_nodes(graph, rename)
    eos_penalty = np.zeros(spec.target_vocab_size, dtype=np.float32)
    eos_penalty[EOS] = -np.inf
    weights += [const(LOOP + "eos_penalty", eos_penalty), const(LOOP + "no_penalty", np.zeros_like(eos_penalty)),
                const(LOOP + "eos", np.array(EOS, dtype=np.int64)), const(LOOP + "pad", np.array(PAD, dtype=np.int64)),
                const(LOOP + "zero", np.array(0.0, dtype=np.float32)), const(LOOP + "axis1", np.array([1], np.int64))]
    L = LOOP
    nodes += [
        helper.make_node("Less", [L + "iter", "min_length"], [L + "early"]),
        helper.make_node("Where", [L + "early", L + "eos_penalty", L + "no_penalty"], [L + "penalty"]),
        helper.make_node("Add", [rename["log_probs"], L + "penalty"], [L + "log_probs"]),  # (B, V)
        helper.make_node("ArgMax", [L + "log_probs"], [L + "best"], axis=1, keepdims=0),  # (B,)
        helper.make_node("Unsqueeze", [L + "best", L + "axis1"], [L + "best_col"]),  # (B, 1)
        helper.make_node("GatherElements", [L + "log_probs", L + "best_col"], [L + "best_lp_col"], axis=1),
        helper.make_node("Squeeze", [L + "best_lp_col", L + "axis1"], [L + "best_lp"]),  # (B,)
        helper.make_node("Where", [L + "finished_in", L + "pad", L + "best"], [L + "next_previous_tokens"]),
        helper.make_node("Where", [L + "finished_in", L + "zero", L + "best_lp"], [L + "scan_token_log_probs"]),
        helper.make_node("Identity", [L + "next_previous_tokens"], [L + "scan_tokens"]),
        helper.make_node("Equal", [L + "best", L + "eos"], [L + "is_eos"]),
        helper.make_node("Or", [L + "finished_in", L + "is_eos"], [L + "finished_out"]),
        helper.make_node("Not", [L + "finished_out"], [L + "live"]),
        helper.make_node("Cast", [L + "live"], [L + "live_int"], to=TensorProto.INT64),
        helper.make_node("ReduceMax", [L + "live_int"], [L + "any_live"], keepdims=0),  # () over every row
        helper.make_node("Cast", [L + "any_live"], [L + "cond_out"], to=TensorProto.BOOL),
    ]
    outputs = [value(L + "cond_out", TensorProto.BOOL, []), value(L + "next_previous_tokens", TensorProto.INT64),
               value(L + "finished_out", TensorProto.BOOL)]
    outputs += [value(rename[produced], types[produced]) for _, produced in feedback]  # the step's own values
    outputs += [value(L + "scan_tokens", TensorProto.INT64), value(L + "scan_token_log_probs", TensorProto.FLOAT)]
    if spec.has_attention:
        outputs.append(value(rename["alphas"], types["alphas"]))
    inputs = [value(L + "iter", TensorProto.INT64, []), value(L + "cond_in", TensorProto.BOOL, []),
              value(rename["previous_tokens"], TensorProto.INT64), value(L + "finished_in", TensorProto.BOOL)]
    inputs += [value(rename[fed], types[fed]) for fed, _ in feedback]
    for i, node in enumerate(nodes):
        node.name = node.name or f"{L}n{i}"
    body = helper.make_graph(nodes, "greedy_body", inputs, outputs, initializer=weights)
    return body, ["previous_tokens", "finished"] + [fed for fed, _ in feedback]


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


def outer_graph(body: onnx.GraphProto, carried: list[str], step: onnx.GraphProto,
                spec: ModelSpec) -> onnx.GraphProto:
    """Inputs as the contract declares, the Loop, and its scan outputs made batch-first."""
    io = greedy_io(spec)
    types = elem_types(step)
    inputs = [value(name, types.get(name, TensorProto.INT64), dims) for name, dims in io["inputs"].items()]
    outputs = [value(name, TensorProto.INT64 if name == "tokens" else TensorProto.FLOAT, dims)
               for name, dims in io["outputs"].items()]
    weights = [const(LOOP + "true", np.array(True))]
    nodes: list[onnx.NodeProto] = []
    if spec.kind == "tokens":
        length, (first, first_axis) = "max_length", next(iter(state_batch_axes(spec).items()))
        batch = dim(nodes, weights, first, first_axis)
        weights += [const(LOOP + "bos", np.array([BOS], np.int64)), const(LOOP + "false", np.array([False]))]
        nodes += [helper.make_node("Expand", [LOOP + "bos", batch], [LOOP + "first_tokens"]),
                  helper.make_node("Expand", [LOOP + "false", batch], [LOOP + "first_finished"])]
        initial = [LOOP + "first_tokens", LOOP + "first_finished", *carried[2:]]
        source_len = dim(nodes, weights, "source_mask", 1) if spec.has_attention else ""
        shapes = {"tokens": ([batch], [1, 0]), "token_log_probs": ([batch], [1, 0]),
                  "alphas": ([batch, source_len], [1, 0, 2])}
    else:
        length, initial = "target_len", list(carried)
        batch = dim(nodes, weights, "decoder_input", 0)
        weights.append(const(LOOP + "features", np.array([spec.n_features], np.int64)))
        if spec.attention == "multihead":
            weights.append(const(LOOP + "heads", np.array([spec.n_heads], np.int64)))
        source_len = dim(nodes, weights, "source_mask", 2) if spec.has_attention else ""
        multihead = spec.attention == "multihead"
        shapes = {"outputs": ([batch, LOOP + "features"], [1, 0, 2]),
                  "alphas": ([batch, LOOP + "heads", source_len], [1, 2, 0, 3]) if multihead
                  else ([batch, source_len], [1, 0, 2])}
    finals = [f"{LOOP}final_{name}" for name in carried]
    scan_names = {name: f"{LOOP}stacked_{name}" for name in io["outputs"]}
    nodes.append(helper.make_node("Loop", [length, LOOP + "true", *initial], [*finals, *scan_names.values()],
                                  name=LOOP + "greedy", body=body))
    for name in io["outputs"]:
        batch_first(nodes, weights, scan_names[name], name, *shapes[name])
    for i, node in enumerate(nodes):
        node.name = node.name or f"{LOOP}outer{i}"
    return helper.make_graph(nodes, "seq2onnx_greedy_loop", inputs, outputs, initializer=weights)


def build_greedy_graph(step_path: Path, spec: ModelSpec) -> onnx.ModelProto:
    """The greedy loop model around the step graph at `step_path` (metadata and checks: graphs.finish_graph)."""
    step = onnx.load(str(step_path))
    io = greedy_io(spec)
    loop_carried = {"decoder_input", "hidden"} if spec.kind != "tokens" else (
        {"previous_tokens"} | {fed for out, fed in FEEDBACK.items() if fed in {v.name for v in step.graph.input}})
    outer = {v.name for v in step.graph.input} - loop_carried
    missing = sorted(outer - set(io["inputs"]))
    if missing:
        raise ExportError(f"{DECODER_STEP_FILE}: inputs {missing} are neither loop-carried nor greedy loop inputs")
    rename = rename_step(step.graph, outer)
    builder = token_body if spec.kind == "tokens" else point_body
    body, carried = builder(step.graph, rename, spec)
    graph = outer_graph(body, carried, step.graph, spec)
    model = helper.make_model(graph, opset_imports=list(step.opset_import), producer_name=step.producer_name,
                              producer_version=step.producer_version)
    model.ir_version = step.ir_version
    return model


def write_greedy_graph(out_dir: Path, spec: ModelSpec) -> Path:
    """Build the greedy loop from out_dir's step graph and save it beside it (unchecked; see graphs.finish_graph)."""
    path = out_dir / GREEDY_FILE
    onnx.save(build_greedy_graph(out_dir / DECODER_STEP_FILE, spec), str(path))
    return path
