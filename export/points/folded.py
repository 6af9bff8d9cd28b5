"""The greedy loop of a point model with attention, written from the model's weights with its arithmetic folded, so
that a step runs fewer and smaller onnxruntime kernels than the traced step does in `export.fused`'s loop.

A step is GRU -> attention -> regression, and the next step's input is this step's output point x. The folds, made
in float64 from the model's own parameters (the exported step graph stays as traced, and this graph is checked
against PyTorch like every other):
- The loop carries V = [xc; h; 1]: xc (F) is the context's share of the last output point, h the hidden state. The
  point is linear in V (x = X V), so the GRU's input products W_ih x become products of V, and the hidden products
  join them: r and z are one Gemm of V (onnxruntime fuses its Sigmoid), n one more whose C is r * (W_hn h + b_hn)
  (from N_THROUGH_POINT_WEIGHTS on, n's input part goes through the point instead: two small Gemms).
- h carries one more unit that stays 1 (its update gate and candidate saturate at SATURATE), so every bias is a
  weight column over that unit. The scores are one MatMul of h with keys projected once a call: W_q^T K / sqrt(d_k),
  and a last row b_q K / sqrt(d_k) where the source is real and MASK_FILL where it is padding.
- The context reaches the output only through the regression (and multi-head's linear_out), so the values are
  projected once a call onto the output: a step weighs F columns per head, not the hidden size.
- The loop scans V (made at the top of a step, so no Identity names it twice), or where n goes through the point
  the [x; 1] it makes, and the output points are made after it, one MatMul for them all. The steps run in a Scan
  (export.scan_steps), which costs less a step than a Loop.
A step is 14 kernels after onnxruntime's fusions (15 multi-head; one more through the point) where the traced
loop's is 21 (23): 0.76-0.77x its time at batch 1 and 0.81-0.92x at 4-256 (hidden 64; README: "The greedy loop
graph"). Reduced-precision exports keep the traced loop around their converted step: the saturating weight would
set an int8 tensor's one scale, and float16 holds neither it nor MASK_FILL. A non-finite decoder_input makes its
row NaN here (the constant unit reads it times 0) where the traced loop's GRU saturates; the runtime refuses
non-finite sources first. A model without attention keeps the traced loop (folded, it measured slower: README).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from export.fused import batch_first, const, dim, value
from export.scan_steps import fixed_steps
from runtime.contract import BATCH, SOURCE_LEN, point_greedy_io
from runtime.spec import ModelSpec
from training.points.models import MASK_FILL, Attention, EncoderDecoder

NAME = "fold/"
SATURATE = 30.0  # sigmoid(30) and tanh(30) round to 1 in float32: the constant unit's gate and candidate
# n's input product W_in x is of rank F. Folded into one product of V it reads (F + H + 1) x (H + 1) weights a row;
# through the point (V -> [x; 1] -> n) two small products, one kernel more. Measured (loop_graph_ab, 1 thread, batch
# 1 / 16 / 64, two through the point over one of V): hidden 64 1.025-1.039 / 0.96-0.98 / 0.97-0.98 (4,355
# weights), 96 0.985-0.991 / 0.955-0.961 (9,603), 128 0.960-0.966 / 0.936-0.938 / 0.918-0.945, 256 0.86-0.88 /
# - / 0.90-0.91. Through the point from this many weights on:
N_THROUGH_POINT_WEIGHTS = 8192


class Folds:
    """The folded weights, float64: `x` maps V to the output point; `wrz`, `wxn` (of V) and `whn` (of h) are the
    GRU's, and `point` ([x; 1] of V) and `wn_point` (n's input part of it) the same n through the point; per head,
    `query` and `query_bias` project the keys and `value_share` the values."""

    def __init__(self, model: EncoderDecoder) -> None:
        decoder = model.decoder
        attn, rnn = decoder.attn, decoder.basic_rnn
        w_ih, w_hh, b_ih, b_hh = (_read(getattr(rnn, f"{n}_l0")) for n in ("weight_ih", "weight_hh", "bias_ih",
                                                                            "bias_hh"))
        w_r, b_r = _read(decoder.regression.weight), _read(decoder.regression.bias)  # (F, 2H) of [context, h]
        heads = [attn] if isinstance(attn, Attention) else list(attn.attn_heads)
        self.multihead = not isinstance(attn, Attention)
        self.size, self.features = size, features = w_hh.shape[1], w_ih.shape[1]
        w_rc = w_r[:, :size]  # the context's share of the output
        if self.multihead:  # context = linear_out([c_1 .. c_heads]): a share per head, and a constant
            w_o, b_o = _read(attn.linear_out.weight), _read(attn.linear_out.bias)
            shares = [w_rc @ w_o[:, i * size:(i + 1) * size] for i in range(len(heads))]
            b_r = b_r + w_rc @ b_o
        else:
            shares = [w_rc]
        self.value_share = np.stack([s.T for s in shares])  # (heads, H, F)
        self.width = width = features + size + 1  # V = [xc; h; 1]
        one = width - 1
        self.x = np.zeros((features, width))
        self.x[:, :features] = np.eye(features)
        self.x[:, features:one] = w_r[:, size:]
        self.x[:, one] = b_r

        def gate(rows: slice, hidden: bool, bias: np.ndarray, constant: float) -> np.ndarray:
            """A gate's pre-activation as rows over V, then the constant unit's row."""
            w = w_ih[rows] @ self.x
            if hidden:
                w[:, features:one] += w_hh[rows]
            w[:, one] += bias
            unit = np.zeros((1, width))
            unit[0, one] = constant
            return np.vstack([w, unit])

        r, z, n = slice(0, size), slice(size, 2 * size), slice(2 * size, 3 * size)
        # the constant unit: r = sigmoid(0) times its W_hn row of 0 adds nothing to n = tanh(30) = 1, and z = 1
        # keeps h = 1
        self.wrz = np.vstack([gate(r, True, b_ih[r] + b_hh[r], 0.0), gate(z, True, b_ih[z] + b_hh[z], SATURATE)])
        self.wxn = gate(n, False, b_ih[n], SATURATE)
        self.point = np.vstack([self.x, np.eye(1, width, one)])  # (F + 1, K): V -> [x; 1]
        self.wn_point = np.zeros((size + 1, features + 1))  # [x; 1] -> n's input part, the unit's row saturated
        self.wn_point[:size, :features], self.wn_point[:size, features] = w_ih[n], b_ih[n]
        self.wn_point[size, features] = SATURATE
        self.n_through_point = self.wxn.size >= N_THROUGH_POINT_WEIGHTS
        self.whn = np.zeros((size + 1, size + 1))
        self.whn[:size, :size], self.whn[:size, size] = w_hh[n], b_hh[n]
        scale = math.sqrt(heads[0].d_k)
        self.query = np.stack([_read(a.linear_query.weight).T / scale for a in heads])  # (heads, H, H)
        self.query_bias = np.stack([_read(a.linear_query.bias)[None] / scale for a in heads])  # (heads, 1, H)


def _read(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float64).cpu().numpy()


class _Graph:
    """Nodes and initializers under NAME, each node named after its first output."""

    def __init__(self, spec: ModelSpec) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[TensorProto] = []
        self.arrays: dict[str, np.ndarray] = {}
        io = point_greedy_io(spec)
        self.own = {*io["inputs"], *io["outputs"]}  # the graph's inputs and outputs keep their names

    def w(self, name: str, array: np.ndarray) -> str:
        """A weight (float arrays written as float32); asked for again, the one already written."""
        if array.dtype == np.float64:
            array = np.ascontiguousarray(array, dtype=np.float32)
        if NAME + name in self.arrays:
            assert np.array_equal(self.arrays[NAME + name], array), name
        else:
            self.arrays[NAME + name] = array
            self.weights.append(const(NAME + name, array))
        return NAME + name

    def op(self, op_type: str, inputs: list[str], outputs: str | list[str], **attrs) -> str:
        """A node; names other than the graph's own and scoped ones ('loop/...') get NAME. Returns its first
        output."""
        named = lambda x: x if x in self.own or "/" in x or not x else NAME + x  # noqa: E731
        outs = [named(o) for o in ([outputs] if isinstance(outputs, str) else outputs)]
        self.nodes.append(helper.make_node(op_type, [named(i) for i in inputs], outs, name=outs[0], **attrs))
        return outs[0]


def folded_loop(model: EncoderDecoder, spec: ModelSpec, opset: list[onnx.OperatorSetIdProto],
                ir_version: int) -> onnx.ModelProto:
    """greedy_loop.onnx of a point model with attention, with the contract's inputs and outputs
    (point_greedy_io); unchecked (see graphs.finish_graph)."""
    folds, outer = Folds(model), _Graph(spec)
    batch = dim(outer.nodes, outer.weights, "decoder_input", 0)
    _first_state(folds, outer, batch)
    source_len = dim(outer.nodes, outer.weights, "source_mask", 2)
    values = _keys_and_values(folds, outer, source_len)
    fixed_steps(outer.nodes, outer.weights, "target_len", [NAME + "xc0", NAME + "h0_unit"],
                [NAME + "xc_final", NAME + "h_final"], [NAME + "stacked", NAME + "stacked_alphas"],
                _body(folds, values, spec), NAME + "scan/")
    _points(folds, outer, batch)
    if folds.multihead:
        heads = outer.w("heads", np.array([len(folds.query)], np.int64))
        batch_first(outer.nodes, outer.weights, NAME + "stacked_alphas", "alphas", [batch, heads, source_len],
                    [1, 2, 0, 3])
    else:
        batch_first(outer.nodes, outer.weights, NAME + "stacked_alphas", "alphas", [batch, source_len], [1, 0, 2])
    io = point_greedy_io(spec)
    kinds = {"source_mask": TensorProto.BOOL, "target_len": TensorProto.INT64}
    graph = helper.make_graph(outer.nodes, "seq2onnx_folded_greedy_loop",
                              [value(n, kinds.get(n, TensorProto.FLOAT), d) for n, d in io["inputs"].items()],
                              [value(n, TensorProto.FLOAT, d) for n, d in io["outputs"].items()],
                              initializer=outer.weights)
    proto = helper.make_model(graph, opset_imports=list(opset), producer_name="seq2onnx")
    proto.ir_version = ir_version
    return proto


def _first_state(folds: Folds, g: _Graph, batch: str) -> None:
    """The first xc = x0 - X_h h0 - b (so that X V is the encoder's decoder_input), and h0 with its unit."""
    g.op("Gather", ["hidden", g.w("index_0", np.array(0, np.int64))], "h0", axis=0)  # (N, H)
    g.op("Gather", ["decoder_input", "index_0"], "x0", axis=1)  # (N, F)
    size, features = folds.size, folds.features
    g.op("Gemm", ["h0", g.w("x_of_h", folds.x[:, features:features + size].T), g.w("x_bias", folds.x[:, -1])],
         "x0_of_h")
    g.op("Sub", ["x0", "x0_of_h"], "xc0")
    g.op("Concat", [batch, g.w("axis_1", np.array([1], np.int64))], "column", axis=0)
    g.op("ConstantOfShape", ["column"], "ones", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    g.op("Concat", ["h0", "ones"], "h0_unit", axis=1)


def _points(folds: Folds, g: _Graph, batch: str) -> None:
    """outputs (N, T, F): X V' for each step's V' = [xc'; h'], which the next step scans as its V, or as its point
    [x; 1] where n goes through the point (x_0 .. x_T-1), and the final carried values make (V_T); a zero-trip loop
    gives (N, 0, F)."""
    steps = dim(g.nodes, g.weights, NAME + "stacked", 0)
    scanned = (np.eye(folds.features + 1, folds.features) if folds.n_through_point else folds.x.T)  # -> x
    g.op("Concat", [steps, batch, g.w("width", np.array([len(scanned)], np.int64))], "stacked_shape", axis=0)
    g.op("Reshape", ["stacked", "stacked_shape"], "stacked_rows", allowzero=1)  # (T, N, K), also when T or N is 0
    g.op("MatMul", ["stacked_rows", g.w("scanned_points", scanned)], "inputs_x")  # x_0 .. x_T-1
    g.op("Concat", ["xc_final", "h_final"], "v_final", axis=1)
    g.op("MatMul", ["v_final", g.w("to_points", folds.x.T)], "last_x")
    g.op("Unsqueeze", ["last_x", g.w("axis_0", np.array([0], np.int64))], "last_x_row")
    g.op("Concat", ["inputs_x", "last_x_row"], "every_x", axis=0)  # x_0 .. x_T
    end = g.w("end", np.array([np.iinfo(np.int64).max], np.int64))
    g.op("Slice", ["every_x", g.w("axis_1", np.array([1], np.int64)), end, "axis_0"], "outputs_x")  # x_1 .. x_T
    g.op("Transpose", ["outputs_x"], "outputs", perm=[1, 0, 2])


def _keys_and_values(folds: Folds, g: _Graph, source_len: str) -> str:
    """keys_t (N, [heads,] H, L) -> the scores' keys of h and its unit (N, [heads,] H + 1, L); values (N, [heads,]
    L, H) -> their share of the output point (N, [heads *] L, F). Returns the latter's name. Multi-head: also
    `row_shape`, the body's (N, 1, heads * L) (every shape spelt out: N may be 0, where -1 cannot be inferred)."""
    multi = folds.multihead
    pick = (lambda a: a) if multi else (lambda a: a[0])  # noqa: E731
    g.op("MatMul", [g.w("query", pick(folds.query)), "keys_t"], "keys_q")
    g.op("MatMul", [g.w("query_bias", pick(folds.query_bias)), "keys_t"], "keys_bias")
    axis_1 = g.w("axis_1", np.array([1], np.int64))
    mask = g.op("Unsqueeze", ["source_mask", axis_1], "head_mask") if multi else "source_mask"  # (N, 1, 1, L)
    g.op("Where", [mask, "keys_bias", g.w("fill", np.array(MASK_FILL, np.float32))], "keys_masked")
    g.op("Concat", ["keys_q", "keys_masked"], "keys", axis=2 if multi else 1)
    values = g.op("MatMul", ["values", g.w("value_share", pick(folds.value_share))], "values_x")
    if multi:  # the heads' rows side by side, as the body's weights are
        g.op("Mul", [source_len, g.w("heads", np.array([len(folds.query)], np.int64))], "heads_len")
        g.op("Concat", [g.w("minus_1", np.array([-1], np.int64)), "heads_len", g.w("features", np.array(
            [folds.features], np.int64))], "flat_shape", axis=0)
        values = g.op("Reshape", [values, "flat_shape"], "values_flat")
        g.op("Concat", ["minus_1", axis_1, "heads_len"], "row_shape", axis=0)
    return values


def _body(folds: Folds, values: str, spec: ModelSpec) -> onnx.GraphProto:
    """xc (N, F), h (N, H + 1) -> xc', h'; scans V = [xc; h] and the attention weights."""
    b, unit, multi = _Graph(spec), folds.size + 1, folds.multihead
    b.op("Concat", ["xc", "h"], "v", axis=1)  # scanned here (or [x; 1], below): no carried value, so no Identity
    b.op("Gemm", ["v", b.w("wrz", folds.wrz.T)], "rz_pre")
    b.op("Sigmoid", ["rz_pre"], "rz")
    b.op("Split", ["rz", b.w("halves", np.array([unit, unit], np.int64))], ["r", "z"], axis=1)
    b.op("MatMul", ["h", b.w("whn", folds.whn.T)], "hn")
    b.op("Mul", ["r", "hn"], "r_hn")
    if folds.n_through_point:  # two small products through the point (N_THROUGH_POINT_WEIGHTS)
        b.op("Gemm", ["v", b.w("point", folds.point.T)], "x_unit")
        b.op("Gemm", ["x_unit", b.w("wn_point", folds.wn_point.T), "r_hn"], "n_pre")
    else:
        b.op("Gemm", ["v", b.w("wxn", folds.wxn.T), "r_hn"], "n_pre")
    b.op("Tanh", ["n_pre"], "n")
    b.op("Sub", ["h", "n"], "h_minus_n")
    b.op("Mul", ["z", "h_minus_n"], "z_h_minus_n")
    b.op("Add", ["n", "z_h_minus_n"], "h_next")  # (1 - z) n + z h
    b.op("Reshape", ["h_next", b.w("as_query", np.array([-1, 1, 1, unit] if multi else [-1, 1, unit], np.int64))],
         "h_query")
    b.op("MatMul", ["h_query", "keys"], "scores")  # (N, [heads,] 1, L)
    weights = b.op("Softmax", ["scores"], "step_alphas", axis=-1)
    if multi:  # (N, 1, heads * L): one product sums the heads' shares
        weights = b.op("Reshape", [weights, "row_shape"], "alphas_row")
    b.op("MatMul", [weights, values], "xc3")  # (N, 1, F)
    b.op("Reshape", ["xc3", b.w("as_rows", np.array([-1, folds.features], np.int64))], "xc_next")
    scalar = lambda name, kind: value(NAME + name, kind, [])  # noqa: E731
    inputs = [scalar("iter", TensorProto.INT64), scalar("cond", TensorProto.BOOL),
              value(NAME + "xc", TensorProto.FLOAT), value(NAME + "h", TensorProto.FLOAT)]
    heads = [len(folds.query)] if multi else []
    scan = ("x_unit", folds.features + 1) if folds.n_through_point else ("v", folds.width)  # the smaller: _points
    shapes = {"xc_next": [BATCH, folds.features], "h_next": [BATCH, unit], scan[0]: [BATCH, scan[1]],
              "step_alphas": [BATCH, *heads, 1, SOURCE_LEN]}  # declared: the stacked outputs' shapes
    outputs = [scalar("cond", TensorProto.BOOL), *(value(NAME + n, TensorProto.FLOAT, d) for n, d in shapes.items())]
    return helper.make_graph(b.nodes, "folded_greedy_body", inputs, outputs, initializer=b.weights)
