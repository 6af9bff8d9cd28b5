"""The greedy loop graph of a token model (machinery: `export.fused`): carry the previous token, which rows have
finished and the fed-back state; pick the argmax in the body (TopK; ties: the lowest id, as numpy), forbid eos below
`min_length`, and stop once every row has emitted eos; after the loop, blank what rows decoded past their eos.
The body adds 9 nodes to the step's (it added 16 before TopK, the precomputed eos table and the blanking after)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.fused import LOOP, LoopKind, Shapes, body_nodes, const, dim, elem_types, value
from runtime.contract import SOURCE_LEN
from runtime.declared import TokenContract


def carried(step_inputs: set[str], contract: TokenContract) -> set[str]:
    """The step inputs the loop carries: the previous token and the state the step feeds back."""
    return {"previous_tokens"} | {fed for fed in contract.feedback.values() if fed in step_inputs}


def token_body(graph: onnx.GraphProto, rename: dict[str, str],
               contract: TokenContract) -> tuple[onnx.GraphProto, list[str]]:
    """Tokens: carry (previous_tokens, finished, fed-back state); add the step's eos penalty (the row the outer
    graph's tables give it: `penalties`), pick the argmax with TopK (ties: the lowest id), scan the chosen tokens,
    their log-probs and alphas, and continue while any row has not emitted eos. Rows that ended keep decoding:
    `finish` blanks them."""
    types = elem_types(graph)
    feedback = [(fed, out) for out, fed in contract.feedback.items() if out in types and fed in types]
    nodes, weights = body_nodes(graph, rename)
    weights += [const(LOOP + "eos", np.array(contract.specials.eos, dtype=np.int64)),
                const(LOOP + "k", np.array([1], np.int64)),
                const(LOOP + "half", np.array(0.5, dtype=np.float32)), const(LOOP + "axis1", np.array([1], np.int64))]
    L = LOOP
    nodes += [
        helper.make_node("Gather", [L + "early", L + "iter"], [L + "early_now"]),  # 1 while iter < min_length
        helper.make_node("Gather", [L + "eos_rows", L + "early_now"], [L + "penalty"]),  # (V,)
        helper.make_node("Add", [rename["log_probs"], L + "penalty"], [L + "log_probs"]),  # (B, V)
        helper.make_node("TopK", [L + "log_probs", L + "k"], [L + "scan_token_log_probs", L + "scan_tokens"],
                         axis=1),  # (B, 1) each
        helper.make_node("Squeeze", [L + "scan_tokens", L + "axis1"], [L + "next_previous_tokens"]),  # (B,)
        helper.make_node("Equal", [L + "scan_tokens", L + "eos"], [L + "is_eos"]),
        helper.make_node("Or", [L + "finished_in", L + "is_eos"], [L + "finished_out"]),  # (B, 1)
        helper.make_node("Cast", [L + "finished_out"], [L + "finished_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMin", [L + "finished_float"], [L + "all_finished"], keepdims=0),  # ()
        helper.make_node("Less", [L + "all_finished", L + "half"], [L + "cond_out"]),  # any row live
    ]
    outputs = [value(L + "cond_out", TensorProto.BOOL, []), value(L + "next_previous_tokens", TensorProto.INT64),
               value(L + "finished_out", TensorProto.BOOL)]
    outputs += [value(rename[produced], types[produced]) for _, produced in feedback]  # the step's own values
    outputs += [value(L + "scan_tokens", TensorProto.INT64), value(L + "scan_token_log_probs", TensorProto.FLOAT)]
    if contract.has_attention:
        outputs.append(value(rename["alphas"], types["alphas"]))
    inputs = [value(L + "iter", TensorProto.INT64, []), value(L + "cond_in", TensorProto.BOOL, []),
              value(rename["previous_tokens"], TensorProto.INT64), value(L + "finished_in", TensorProto.BOOL)]
    inputs += [value(rename[fed], types[fed]) for fed, _ in feedback]
    for i, node in enumerate(nodes):
        node.name = node.name or f"{L}n{i}"
    body = helper.make_graph(nodes, "greedy_body", inputs, outputs, initializer=weights)
    return body, ["previous_tokens", "finished"] + [fed for fed, _ in feedback]


def penalties(nodes: list[onnx.NodeProto], weights: list[TensorProto], contract: TokenContract) -> None:
    """LOOP/early (max_length,) int64, 1 while step t < min_length, and LOOP/eos_rows (2, V): row 0 adds nothing,
    row 1 -inf to eos; step t adds row early[t] (a (max_length, V) table would cost O(max_length x V) a call:
    export.tokens.kernels.min_length)."""
    rows = np.zeros((2, contract.target_vocab_size), dtype=np.float32)
    rows[1, contract.specials.eos] = -np.inf
    weights += [const(LOOP + "eos_rows", rows), const(LOOP + "zero_i", np.array(0, np.int64)),
                const(LOOP + "one_i", np.array(1, np.int64))]
    nodes += [helper.make_node("Range", [LOOP + "zero_i", "max_length", LOOP + "one_i"], [LOOP + "steps"]),  # (T,)
              helper.make_node("Less", [LOOP + "steps", "min_length"], [LOOP + "early_steps"]),
              helper.make_node("Cast", [LOOP + "early_steps"], [LOOP + "early"], to=TensorProto.INT64)]


def outer(nodes: list[onnx.NodeProto], weights: list[TensorProto], contract: TokenContract,
          carried: list[str]) -> tuple[str, list[str], Shapes]:
    """The loop's length input (max_length), its carried values' first values (bos, none finished, the encoder's
    state), the eos penalty's tables, and the batch-first shape of each scan output: tokens and token_log_probs
    (batch, decode_len), alphas (batch, decode_len, source_len)."""
    first, first_axis = next(iter(contract.batch_axes.items()))
    batch = dim(nodes, weights, first, first_axis)
    weights += [const(LOOP + "bos", np.array([contract.specials.bos], np.int64)),
                const(LOOP + "false", np.array([[False]])), const(LOOP + "one", np.array([1], np.int64))]
    nodes += [helper.make_node("Expand", [LOOP + "bos", batch], [LOOP + "first_tokens"]),
              helper.make_node("Concat", [batch, LOOP + "one"], [LOOP + "column"], axis=0),  # [B, 1]
              helper.make_node("Expand", [LOOP + "false", LOOP + "column"], [LOOP + "first_finished"])]
    penalties(nodes, weights, contract)
    initial = [LOOP + "first_tokens", LOOP + "first_finished", *carried[2:]]
    source_len = _source_len(nodes, weights, contract) if contract.has_attention else ""
    shapes = {"tokens": ([batch], [1, 0]), "token_log_probs": ([batch], [1, 0]),
              "alphas": ([batch, source_len], [1, 0, 2])}
    return "max_length", initial, shapes


def _source_len(nodes: list[onnx.NodeProto], weights: list[TensorProto], contract: TokenContract) -> str:
    """A 1-D tensor holding the attention's source length: a state input's source_len dim, else the fixed one."""
    width = contract.step["outputs"]["alphas"][1]
    if isinstance(width, int):
        weights.append(const(LOOP + "source_width", np.array([width], np.int64)))
        return LOOP + "source_width"
    name, dims = next((name, dims) for name, dims in contract.state.items() if SOURCE_LEN in dims)
    return dim(nodes, weights, name, dims.index(SOURCE_LEN))


def finish(nodes: list[onnx.NodeProto], weights: list[TensorProto], produced: dict[str, str],
           contract: TokenContract) -> dict[str, str]:
    """After a row's first eos: tokens 0 and log-probs 0 (the loop ran on until every row had ended)."""
    L = LOOP
    weights += [const(L + "eos_id", np.array(contract.specials.eos, np.int64)), const(L + "pad", np.array(0, np.int64)),
                const(L + "zero_f", np.array(0.0, np.float32)), const(L + "time_axis", np.array(1, np.int64)),
                const(L + "none", np.array(0, np.int64))]
    nodes += [helper.make_node("Equal", [produced["tokens"], L + "eos_id"], [L + "eos_at"]),  # (B, T)
              helper.make_node("Cast", [L + "eos_at"], [L + "eos_count"], to=TensorProto.INT64),
              helper.make_node("CumSum", [L + "eos_count", L + "time_axis"], [L + "eos_so_far"]),
              helper.make_node("Sub", [L + "eos_so_far", L + "eos_count"], [L + "eos_before"]),
              helper.make_node("Greater", [L + "eos_before", L + "none"], [L + "after_eos"]),
              helper.make_node("Where", [L + "after_eos", L + "pad", produced["tokens"]], [L + "tokens_out"]),
              helper.make_node("Where", [L + "after_eos", L + "zero_f", produced["token_log_probs"]],
                               [L + "token_log_probs_out"])]
    return {**produced, "tokens": L + "tokens_out", "token_log_probs": L + "token_log_probs_out"}


LOOP_KIND = LoopKind(TokenContract.greedy_io, carried, token_body, outer, finish)
