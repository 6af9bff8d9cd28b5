"""What the manifest says of a converted export (its `precision` entry): which graphs a conversion rewrites, what
became int8 or float16, what stayed float32, and how many quantized ops each graph holds."""
from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import onnx

from export.graph_nodes import subgraphs
from export.tokens.int8 import WIDEN_UP_TO, widens
from runtime.contract import BEAM_STEP_FILE, FAST_FILES, graph_io
from runtime.defaults import INT8
from runtime.optional_graphs import optional_graph_io
from runtime.spec import ModelSpec

WIDENED = "Cast (int8 weights widened to float32)"  # quantized_ops' name for a widened weight
# What an int8 graph must contain for its quantization to have happened at all.
QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "DynamicQuantizeLinear",
                 "DequantizeLinear")  # the last: an int8 embedding table (Gather), widened after the lookup


def converted_graphs(model_dir: Path, spec: ModelSpec) -> list[str]:
    """The graphs a conversion rewrites: the encoder and step, and a recurrent model's beam step when there is one
    (the greedy loop is rebuilt around the converted step; a transformer's fast graphs from the weights)."""
    beam = [BEAM_STEP_FILE] if (Path(model_dir) / BEAM_STEP_FILE).exists() else []
    return [*graph_io(spec), *beam]


def precision_entry(model_dir: Path, spec: ModelSpec, mode: str) -> dict[str, Any]:
    """The manifest's account of a conversion: what became what, with which tool, and what stayed float32."""
    present = {**graph_io(spec), **optional_graph_io(spec)}  # the greedy loop, when there is one
    graphs = {name: onnx.load(str(Path(model_dir) / name)) for name in present if (Path(model_dir) / name).exists()}
    own = {name: g for name, g in graphs.items() if name in converted_graphs(model_dir, spec)}  # not the loops
    kept = _float_weight_ops(own) if mode == INT8 else _fp32_ops(own)
    common = {"weights": mode, "io": "float32", "float32_ops": kept,
              "parity": "measured on the float32 graphs before conversion; 'quality' compares the converted ones "
                        "with them"}
    if mode == INT8 and set(FAST_FILES.values()) & set(graphs):  # rebuilt from the weights, not converted
        few = ("in float32 over the same weights, widened as a session loads them" if widens(spec) else
               f"in int8 too (a weight matrix holds more than {WIDEN_UP_TO} values: float32 weights past the caches "
               "cost more to read than a row to quantize)")
        common["fast_graphs"] = ("int8 weights in [-63, 63] with one scale per output column; the graphs for many "
                                 "rows (wide_*, fast_encoder) multiply in int8 (DynamicQuantizeMatMul, activations "
                                 "quantized per call), the graphs for few rows (fold_*, fast_greedy, fast_beam, "
                                 f"fast_decoder_step) {few}; the self-attention's Q/K/V projection (inside the "
                                 "Attention kernel) float32")
    if mode == INT8:
        return {**common, "activations": "uint8, quantized per call (dynamic), where a graph multiplies in int8",
                "per_channel": False,
                "reduce_range": True, "tool": f"onnxruntime.quantization.quantize_dynamic "
                f"(onnxruntime {metadata.version('onnxruntime')})",
                "quantized_ops": {name: quantized_ops(g) for name, g in graphs.items()},
                "target": "CPU: MatMulInteger and DynamicQuantizeMatMul (u8 x s8, 7-bit weights: no saturation "
                          "without VNNI)"}
    return {**common, "activations": "float16", "tool": f"onnxconverter-common "
            f"{metadata.version('onnxconverter-common')} float16.convert_float_to_float16",
            "target": "CUDA; onnxruntime's CPU provider also runs it (nodes without a float16 CPU kernel in float32)"}


def _float_weight_ops(graphs: dict[str, onnx.ModelProto]) -> list[str]:
    """Op types of int8 graphs that still hold float32 weights (GRU: onnxruntime has no quantized kernel)."""
    return sorted({n.op_type for g in graphs.values() for n in g.graph.node if n.op_type in ("GRU", "LSTM", "MatMul",
                   "Gemm", "Gather") and set(n.input) & {t.name for t in g.graph.initializer
                                                         if t.data_type == onnx.TensorProto.FLOAT}})


def _fp32_ops(graphs: dict[str, onnx.ModelProto]) -> list[str]:
    """Op types of float16 graphs that still compute in float32 (a Cast to float32 feeds them)."""
    to_fp32 = {o for g in graphs.values() for n in g.graph.node if n.op_type == "Cast"
               and {a.name: a.i for a in n.attribute}.get("to") == onnx.TensorProto.FLOAT for o in n.output}
    return sorted({n.op_type for g in graphs.values() for n in g.graph.node
                   if n.op_type not in ("Cast", "Identity", "Shape") and set(n.input) & to_fp32})


def quantized_ops(model: onnx.ModelProto | onnx.GraphProto) -> dict[str, int]:
    """How many nodes of each quantized op type a graph holds, subgraphs (a Loop's body) included; int8 weights that
    a graph widens to float32 (a Cast of an int8 initializer, export.tokens.kernels.Net.widen) count as WIDENED."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    int8 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    counts: dict[str, int] = {}
    for node in graph.node:
        op = WIDENED if node.op_type == "Cast" and node.input[0] in int8 else node.op_type
        if op in QUANTIZED_OPS or op == WIDENED:
            counts[op] = counts.get(op, 0) + 1
        for sub in subgraphs(node):
            for op, n in quantized_ops(sub).items():
                counts[op] = counts.get(op, 0) + n
    return counts
