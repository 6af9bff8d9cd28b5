"""Reduced-precision graphs: int8 dynamic quantization (CPU) and float16 weights (CUDA), rewritten in place.

`convert_graphs(model_dir, spec, mode)` rewrites every graph the contract lists. What a converted graph keeps:
its input/output names, dims and dtypes (float32 in and out, so the runtime feeds it unchanged), its doc strings,
its metadata_props (spec, export id) and its IR version. The quality of the result is measured in `export.quality`.

- int8: onnxruntime's `quantize_dynamic`. Weights of MatMul (Gemm is first rewritten as MatMul + Add, which the
  dynamic quantizer does not cover otherwise), Gather (embedding tables) and LSTM become signed int8 with one scale
  per tensor; activations are quantized to uint8 per call (DynamicQuantizeLinear + MatMulInteger, or
  DynamicQuantizeLSTM). u8 x s8 is the kernel AVX-512 VNNI / AVX-VNNI accelerate, but on CPUs without VNNI (AVX2
  only) onnxruntime's u8 x s8 kernel saturates 16-bit pair sums: with full-range weights MatMulInteger returned
  wrong values (off by up to 1.8 on the trained squares model). reduce_range (7-bit weights, -64..63) cannot
  saturate, so the graphs are right on every x86 CPU (u8 x u8 weights were exact too, but slower here).
  GRU has no integer kernel in onnxruntime: its weights stay float32.
- fp16: onnxconverter-common's `convert_float_to_float16`, with float32 inputs and outputs kept (casts inside);
  each graph output first gets an Identity of its own (a keep_io_types bug, see `_outputs_behind_identity`), and
  Transposes feeding a MatMul stay float32 (an onnxruntime CPU crash, see FP16_TRANSPOSE_BEFORE).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from runtime.defaults import FP16, INT8
from runtime.spec import ModelSpec

from .errors import ExportError
from .precision import QUANTIZED_OPS, converted_graphs, quantized_ops

MODES = (FP16, INT8)
# Ops whose weights int8 quantizes; onnxruntime has no dynamically quantized GRU (it stays float32).
INT8_OP_TYPES = ("MatMul", "Gather", "LSTM")
FP16_MAX = 65504.0  # largest finite float16: constants beyond it (a -1e9 mask fill) are clamped to it, not to inf
# onnxruntime 1.31's CPU provider crashes (SIGSEGV, in its level-3 graph optimizations) on a float16 Transpose
# that feeds a float16 MatMul: such Transposes stay float32, between casts.
FP16_TRANSPOSE_BEFORE = ("MatMul", "Gemm")
OUTPUT_SUFFIX = "/seq2onnx_output"
LOAD_PROBE_TIMEOUT_S = 300
LOAD_PROBE = "import sys; from runtime.model import Seq2Seq; Seq2Seq.load(sys.argv[1], provider='cpu')"


def convert_graphs(model_dir: Path, spec: ModelSpec, mode: str) -> None:
    """Rewrite every graph of `spec` in `model_dir` to `mode` ('int8' or 'fp16'), in place."""
    if mode not in MODES:
        raise ExportError(f"precision mode: expected one of {MODES}, got {mode!r}")
    converted = {}
    for name in converted_graphs(model_dir, spec):
        original = onnx.load(str(Path(model_dir) / name))
        converted[name] = quantize_int8(original) if mode == INT8 else to_float16(original)
        keep_identity(original, converted[name], name)
    if mode == INT8 and not any(quantized_ops(g) for g in converted.values()):
        raise ExportError(f"int8 quantization left no quantized op (expected some of {QUANTIZED_OPS}): the graphs "
                          "have no MatMul, Gemm, Gather or LSTM with constant weights; export without --quantize")
    for name, graph in converted.items():  # written only once all converted: a failure leaves the fp32 set whole
        onnx.save(graph, str(Path(model_dir) / name))


def check_loads(model_dir: Path, mode: str) -> None:
    """The runtime must load the converted export on CPU: tried in a child process, since onnxruntime has crashed
    (SIGSEGV) on float16 graphs, which would take the exporting process with it."""
    root = str(Path(__file__).resolve().parent.parent)  # the checkout holding `runtime`, whatever the cwd
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(model_dir)], env=env, capture_output=True,
                              text=True, timeout=LOAD_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ExportError(f"the {mode} graphs: loading them in the runtime took over {LOAD_PROBE_TIMEOUT_S} s; "
                          "nothing was written") from None
    if done.returncode < 0:
        raise ExportError(f"the {mode} graphs: onnxruntime {metadata.version('onnxruntime')} crashed "
                          f"({signal.Signals(-done.returncode).name}) loading them on CPU; nothing was written. "
                          "Export without --dtype/--quantize, or try another onnxruntime version")
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ExportError(f"the {mode} graphs: the runtime cannot load them ({last}); nothing was written")


class _PreprocessAdvice(logging.Filter):
    """Drops quantize_dynamic's advice to pre-process the model first."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Hide quantize_dynamic's advice to pre-process (it logs on the root logger): pre-processing would write
    onnxruntime-specific fused ops into a portable graph, so it is skipped on purpose."""
    root = logging.getLogger()
    advice, placeholder = _PreprocessAdvice(), logging.NullHandler()
    root.addFilter(advice)
    root.addHandler(placeholder)  # else logging.warning() would install a stderr handler on the root logger for good
    try:
        yield
    finally:
        root.removeFilter(advice)
        root.removeHandler(placeholder)


def quantize_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """Dynamic int8 quantization of MatMul (Gemm included), Gather and LSTM weights."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        out = Path(tmp) / "int8.onnx"
        quantize_dynamic(gemm_as_matmul(model), out, op_types_to_quantize=list(INT8_OP_TYPES),
                         weight_type=QuantType.QInt8, per_channel=False, reduce_range=True,
                         extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(out))


def gemm_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every Gemm of constant weights rewritten as MatMul (+ Add), alpha and beta folded in."""
    model = _copy(model)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes = []
    for node in graph.node:
        nodes.extend(_gemm_as_matmul(node, weights, graph) or [node])
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]  # a Gemm's own weights, now transposed and renamed
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _gemm_as_matmul(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto],
                    graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """MatMul (+ Add) nodes computing a Gemm (new weights added to `graph`), or None where it cannot be done:
    weights computed at run time, a transposed A, or a computed bias scaled by beta."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    beta = float(attrs.get("beta", 1.0))
    if (node.op_type != "Gemm" or node.input[1] not in weights or attrs.get("transA", 0)
            or (bias is not None and beta != 1.0 and bias not in weights)):
        return None
    w = numpy_helper.to_array(weights[node.input[1]])
    w = (w.T if attrs.get("transB", 0) else w) * float(attrs.get("alpha", 1.0))  # (K, M)
    w_name = f"{node.input[1]}/{node.name}/matmul"
    graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), w_name))
    product = f"{node.output[0]}/matmul" if bias is not None else node.output[0]
    out = [helper.make_node("MatMul", [node.input[0], w_name], [product], name=f"{node.name}/MatMul")]
    if bias is None:
        return out
    if beta != 1.0:
        scaled = numpy_helper.to_array(weights[bias]) * beta
        bias = f"{bias}/{node.name}/beta"
        graph.initializer.append(numpy_helper.from_array(scaled.astype(np.float32), bias))
    return out + [helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}/Add")]


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Float16 weights and compute, float32 inputs and outputs (casts at the edges)."""
    from onnxconverter_common import float16

    model = _outputs_behind_identity(model)
    block = float16.DEFAULT_OP_BLOCK_LIST
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation notices: the quality report measures what they cost
        return float16.convert_float_to_float16(model, keep_io_types=True, max_finite_val=FP16_MAX,
                                                op_block_list=block, node_block_list=_crashing_transposes(model))


def _outputs_behind_identity(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which each graph output is written by its own Identity node and read by no other node.

    onnxconverter-common 1.16 with keep_io_types casts a graph output back to float32 under its own name, and
    nodes that also read that output then get float32 where float16 is declared: onnxruntime refuses the graph
    (seen with the encoders' `values`/`memory` and the steps' `alphas`/`hidden_out`)."""
    model = _copy(model)
    graph = model.graph
    inner = {o.name: o.name + OUTPUT_SUFFIX for o in graph.output}
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = inner.get(name, name)
        for i, name in enumerate(node.output):
            node.output[i] = inner.get(name, name)
    graph.node.extend(helper.make_node("Identity", [inner[o]], [o], name=inner[o]) for o in inner)
    del graph.value_info[:]  # stale float32 annotations of renamed or retyped values mislead the converter
    return model


def _crashing_transposes(model: onnx.ModelProto) -> list[str]:
    """Names of Transpose nodes that feed a MatMul or Gemm (see FP16_TRANSPOSE_BEFORE)."""
    feeds = {i for n in model.graph.node if n.op_type in FP16_TRANSPOSE_BEFORE for i in n.input}
    return [n.name for n in model.graph.node if n.op_type == "Transpose" and set(n.output) & feeds]


def keep_identity(original: onnx.ModelProto, converted: onnx.ModelProto, name: str) -> None:
    """Give the converted graph the original's doc strings, metadata and IR version; refuse changed I/O."""
    before, after = _io(original), _io(converted)
    if before != after:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        raise ExportError(f"{name}: conversion changed graph inputs/outputs {changed}: expected "
                          f"{[before.get(k) for k in changed]}, got {[after.get(k) for k in changed]}")
    converted.doc_string, converted.graph.doc_string = original.doc_string, original.graph.doc_string
    del converted.metadata_props[:]
    converted.metadata_props.extend(original.metadata_props)
    converted.ir_version = original.ir_version  # the tools write their onnx's newest; onnxruntime may not read it
    try:
        onnx.checker.check_model(converted, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"{name}: the converted graph fails the ONNX checker ({exc})") from None


def _io(model: onnx.ModelProto) -> dict[str, tuple]:
    """{name: (kind, elem type, dims)} of a graph's inputs and outputs."""
    def dims(value: onnx.ValueInfoProto) -> tuple:
        return tuple(d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim)

    return {v.name: (kind, v.type.tensor_type.elem_type, dims(v))
            for kind, values in (("input", model.graph.input), ("output", model.graph.output)) for v in values}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
