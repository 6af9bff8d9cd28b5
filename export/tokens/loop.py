"""The greedy loop graph of a token model (machinery: `export.fused`): carry the previous token, which rows have
finished and the fed-back state; pick the argmax in the body (ties: the lowest id, as numpy), forbid eos below
`min_length`, and stop once every row has emitted eos."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.fused import LOOP, LoopKind, Shapes, body_nodes, const, dim, elem_types, value
from runtime.contract import FEEDBACK, state_batch_axes
from runtime.spec import ModelSpec
from runtime.vocab import BOS, EOS, PAD


def carried(step_inputs: set[str]) -> set[str]:
    """The step inputs the loop carries: the previous token and the state the step feeds back."""
    return {"previous_tokens"} | {fed for fed in FEEDBACK.values() if fed in step_inputs}


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


def outer(nodes: list[onnx.NodeProto], weights: list[TensorProto], spec: ModelSpec,
          carried: list[str]) -> tuple[str, list[str], Shapes]:
    """The loop's length input (max_length), its carried values' first values (bos, none finished, the encoder's
    state), and the batch-first shape of each scan output: tokens and token_log_probs (batch, decode_len), alphas
    (batch, decode_len, source_len)."""
    first, first_axis = next(iter(state_batch_axes(spec).items()))
    batch = dim(nodes, weights, first, first_axis)
    weights += [const(LOOP + "bos", np.array([BOS], np.int64)), const(LOOP + "false", np.array([False]))]
    nodes += [helper.make_node("Expand", [LOOP + "bos", batch], [LOOP + "first_tokens"]),
              helper.make_node("Expand", [LOOP + "false", batch], [LOOP + "first_finished"])]
    initial = [LOOP + "first_tokens", LOOP + "first_finished", *carried[2:]]
    source_len = dim(nodes, weights, "source_mask", 1) if spec.has_attention else ""
    shapes = {"tokens": ([batch], [1, 0]), "token_log_probs": ([batch], [1, 0]),
              "alphas": ([batch, source_len], [1, 0, 2])}
    return "max_length", initial, shapes


LOOP_KIND = LoopKind(carried, token_body, outer)
