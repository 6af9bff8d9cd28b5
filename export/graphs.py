"""Write the graphs with declared names and symbolic dims, and check them; the model's kind (`kinds.KINDS`) gives
the export modules, their example inputs and the graphs' doc strings."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch

from runtime.contract import (
    BEAM_STEP_FILE,
    DECODER_STEP_FILE,
    DYNAMIC_DIMS,
    ENCODER_FILE,
    EXPORT_ID_KEY,
    FAST_FILES,
    FEEDBACK,
    GRAPH_KEY,
    GREEDY_FILE,
    SPEC_KEY,
    Dims,
    graph_io,
    point_greedy_io,
)
from runtime.declared import TokenContract
from runtime.errors import clipped, one_line
from runtime.optional_graphs import fast_graph_io, folds, has_beam_step, token_beam_step_io
from runtime.spec import ModelSpec

from .adapted import Adapted, example_sources
from .adapted_modules import AdaptedEncoder, AdaptedStep
from .adapter import AdapterError
from .errors import ExportError
from .examples import EXAMPLE_BATCH, EXAMPLE_PAST_LEN, EXAMPLE_SIZES, EXAMPLE_SOURCE_LEN
from .fused import write_greedy_graph
from .kinds import KINDS
from .native_output import benign_native_warnings_dropped, quiet_native_stdout
from .points.folded import folded_loop
from .sizes import check_other_sizes
from .tokens import graphs as token_graphs
from .tokens.fast import FAST_BUILDERS
from .tracing import Tracing, untraceable

MIN_OPSET, MAX_OPSET = 14, 20
TRACE_ERROR_CHARS = 600  # of the tracer's message quoted, which may hold a tensor's numbers


def dynamic_axes(io: dict[str, Dims]) -> dict[str, dict[int, str]]:
    """Exporter form of the declared dims: {name: {axis: symbolic name}}."""
    return {name: {i: d for i, d in enumerate(dims) if isinstance(d, str)} for name, dims in io.items()}


def graph_modules(model: Any, spec: ModelSpec) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Each graph's export module and example arguments, the encoder's outputs feeding the step."""
    traced = KINDS[spec.kind].traced(model, spec)
    io = graph_io(spec)
    with torch.no_grad():
        states = dict(zip(traced.encoder.output_names, traced.encoder(*traced.encoder_args)))
    check_example_shapes("encoder output", io[ENCODER_FILE]["outputs"], states)
    states.update(traced.step_inputs)
    inputs, outputs = io[DECODER_STEP_FILE]["inputs"], list(io[DECODER_STEP_FILE]["outputs"])
    for _ in range(traced.steps):  # advance the example state, fed back by the contract, as the runtime does
        with torch.no_grad():
            produced = dict(zip(outputs, traced.step(*(states[name] for name in inputs))))
        states.update({FEEDBACK[name]: value for name, value in produced.items() if name in FEEDBACK})
    check_example_shapes("decoder step input", inputs, states)  # a cache grown by one per step: past_len 2
    step_args = tuple(states[name] for name in inputs)
    return {ENCODER_FILE: (traced.encoder, traced.encoder_args), DECODER_STEP_FILE: (traced.step, step_args)}


def check_example_shapes(what: str, declared: dict[str, Dims], states: dict[str, torch.Tensor]) -> None:
    """Example tensors have the declared shapes, symbolic dims at the example sizes (EXAMPLE_SIZES)."""
    for name, dims in declared.items():
        shape = [EXAMPLE_SIZES.get(d, d) for d in dims]
        if list(states[name].shape) != shape:
            raise ExportError(f"{what} {name!r}: expected example shape {shape}, got {list(states[name].shape)}")


def export_graphs(model: Any, spec: ModelSpec, out_dir: Path, opset: int, export_id: str) -> None:
    """Export encoder.onnx and decoder_step.onnx into out_dir, then fix up and check them; then the optional graphs
    the model has: the greedy loop, a recurrent model's beam step, a transformer's fast graphs."""
    if isinstance(model, Adapted):
        export_adapted(model, out_dir, opset, export_id)
        return
    model.eval()
    modules = graph_modules(model, spec)
    for file_name, io in graph_io(spec).items():
        export_module(*modules[file_name], out_dir / file_name, io, opset)
        finish_graph(out_dir / file_name, io, spec, export_id, file_name)
    if spec.kind == "points" and spec.has_attention:
        export_folded_greedy(model, spec, out_dir, export_id)
    else:
        export_greedy(out_dir, spec, export_id)
    if has_beam_step(spec):
        io = token_beam_step_io(spec)
        with torch.no_grad():
            encoder, args = modules[ENCODER_FILE]
            states = dict(zip(encoder.output_names, encoder(*args)))
        module, args = token_graphs.beam_step(model, spec, states)
        check_example_shapes("beam step input", io["inputs"], dict(zip(io["inputs"], args)))
        export_module(module, args, out_dir / BEAM_STEP_FILE, io, opset)
        finish_graph(out_dir / BEAM_STEP_FILE, io, spec, export_id, BEAM_STEP_FILE)
    if spec.kind == "tokens" and spec.is_transformer:
        export_fast(model, spec, out_dir, export_id)


def keep_unused_inputs(path: Path, io: dict[str, dict[str, Dims]], args: dict[str, torch.Tensor]) -> None:
    """Declared inputs the traced code never read (an encoder that ignores source_lengths) are pruned by the
    exporter; put them back as graph inputs, so every graph takes what its contract declares."""
    model = onnx.load(str(path))
    present = {v.name for v in model.graph.input}
    missing = [name for name in io["inputs"] if name not in present]
    if not missing:
        return
    for name in missing:
        elem = onnx.helper.np_dtype_to_tensor_dtype(args[name].numpy().dtype)
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, io["inputs"][name]))
    order = list(io["inputs"])
    inputs = sorted(model.graph.input, key=lambda v: order.index(v.name) if v.name in order else len(order))
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.save(model, str(path))


def export_module(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, io: dict[str, dict[str, Dims]],
                  opset: int) -> None:
    """The legacy exporter on one module, with the declared names and symbolic dims."""
    module.eval()  # the exporter restores the module's mode afterwards: a wrapper left in training mode would
    # switch the model's dropout back on for the parity checks that follow
    with warnings.catch_warnings(), benign_native_warnings_dropped():
        warnings.simplefilter("ignore")  # tracer warnings about python ints; dims are checked afterwards
        torch.onnx.export(
            module, args, str(path), input_names=list(io["inputs"]), output_names=list(io["outputs"]),
            dynamic_axes={**dynamic_axes(io["inputs"]), **dynamic_axes(io["outputs"])},
            opset_version=opset, dynamo=False, do_constant_folding=True,
        )


def export_fast(model: Any, spec: ModelSpec, out_dir: Path, export_id: str, int8: bool = False) -> None:
    """Write a transformer's fast graphs (`export.tokens.fast`; int8: their weights quantized), with the same
    metadata and checks; the folded ones only where the model's sources fold (optional_graphs.folds)."""
    io = fast_graph_io(spec)
    for role, build in FAST_BUILDERS.items():
        if role.startswith("fold_") and not folds(spec):
            continue
        path = out_dir / FAST_FILES[role]
        onnx.save(build(model, spec, "", int8=int8), str(path))
        finish_graph(path, io[role], spec, export_id, FAST_FILES[role])


def export_greedy(out_dir: Path, spec: ModelSpec, export_id: str, contract: TokenContract | None = None) -> None:
    """Write greedy_loop.onnx around out_dir's (final) decoder step, with the same metadata and checks; a token
    model's loop follows its contract (a declared model's own, else its spec's)."""
    loop = KINDS[spec.kind].loop
    decl = (contract or TokenContract.for_spec(spec)) if spec.kind == "tokens" else spec
    path = write_greedy_graph(out_dir, decl, loop)
    finish_graph(path, loop.io(decl), spec, export_id, GREEDY_FILE)


def export_folded_greedy(model: Any, spec: ModelSpec, out_dir: Path, export_id: str) -> None:
    """A point model with attention: greedy_loop.onnx written from its weights, its arithmetic folded
    (export.points.folded), in the step graph's opset, with the same metadata and checks."""
    step = onnx.load(str(out_dir / DECODER_STEP_FILE))
    path = out_dir / GREEDY_FILE
    onnx.save(folded_loop(model, spec, list(step.opset_import), step.ir_version), str(path))
    finish_graph(path, point_greedy_io(spec), spec, export_id, GREEDY_FILE)


def export_adapted(adapted: Adapted, out_dir: Path, opset: int, export_id: str) -> None:
    """A declared model's encoder.onnx and decoder_step.onnx, traced on example sources (the state advanced
    EXAMPLE_PAST_LEN steps, so a growing axis is neither 0 nor 1), checked at other sizes than traced, and its
    greedy loop."""
    adapter, contract, spec = adapted.adapter, adapted.contract, adapted.spec
    width = adapter.fixed_source_len or EXAMPLE_SOURCE_LEN
    ids, lengths = (torch.from_numpy(a) for a in example_sources(adapter, EXAMPLE_BATCH, width, seed=0))
    encoder, step = AdaptedEncoder(adapter), AdaptedStep(adapter, contract.has_attention)
    with torch.no_grad():
        state = dict(zip(encoder.output_names, encoder(ids, lengths)))
        tokens = torch.full((EXAMPLE_BATCH,), contract.specials.bos, dtype=torch.int64)
        for _ in range(EXAMPLE_PAST_LEN):
            produced = dict(zip(contract.step["outputs"], step(tokens, *state.values())))
            state.update({into: produced[out] for out, into in contract.feedback.items()})
            tokens = produced["log_probs"].argmax(-1)
    graphs = {ENCODER_FILE: (encoder, (ids, lengths)), DECODER_STEP_FILE: (step, (tokens, *state.values()))}
    for file_name, (module, args) in graphs.items():
        io = contract.graph_io()[file_name]
        tracing = Tracing(adapter)
        try:
            with tracing.watch(), quiet_native_stdout():
                export_module(module, args, out_dir / file_name, io, opset)
        except Exception as exc:  # the user's code under the tracer: name where it broke
            where = untraceable(adapter, module, args, exc, tracing.where())
            if "Cannot insert a Tensor that requires grad as a constant" in str(exc):  # its message prints the
                raise AdapterError(  # tensor's numbers; what it means here is a weight outside modules=[...]
                    f"{file_name}: the model cannot be traced{where}: encode or step uses a tensor that requires "
                    "grad and is held by none of the declared modules (torch: 'Cannot insert a Tensor that requires "
                    "grad as a constant'); list every module encode and step use in modules=[...], the very "
                    "objects they call") from None
            raise AdapterError(f"{file_name}: the model cannot be traced{where}: {type(exc).__name__}: "
                               f"{clipped(one_line(exc), TRACE_ERROR_CHARS)}") from exc
        keep_unused_inputs(out_dir / file_name, io, dict(zip(io["inputs"], args)))
        finish_graph(out_dir / file_name, io, spec, export_id, file_name)
    check_other_sizes(adapted, out_dir)
    export_greedy(out_dir, spec, export_id, contract)


def finish_graph(path: Path, io: dict[str, dict[str, Dims]], spec: ModelSpec, export_id: str, file_name: str) -> None:
    """Set declared shapes and metadata, then assert symbolic dims and run the full checker."""
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        declared = {**io["inputs"], **io["outputs"]}[value.name]
        set_dims(value, declared, file_name)
    docs = KINDS[spec.kind].graph_docs(spec)
    model.doc_string = docs[file_name]
    model.graph.doc_string = docs[file_name]
    for key, val in {SPEC_KEY: json.dumps(spec.to_dict(), sort_keys=True), EXPORT_ID_KEY: export_id, GRAPH_KEY: file_name}.items():
        model.metadata_props.add(key=key, value=val)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    assert_symbolic(onnx.load(str(path)), io, file_name)


def set_dims(value: onnx.ValueInfoProto, declared: Dims, file_name: str) -> None:
    """Replace exporter-generated dim names with the declared ones; a symbolic dim (batch, source_len, past_len,
    present_len) that the exporter fixed to a number is an error."""
    dims = value.type.tensor_type.shape.dim
    if len(dims) != len(declared):
        raise ExportError(f"{file_name}: {value.name!r} has rank {len(dims)}, declared {declared}")
    for dim, want in zip(dims, declared):
        if isinstance(want, str) and dim.HasField("dim_value"):
            raise ExportError(f"{file_name}: {value.name!r} dim {want!r} was fixed to {dim.dim_value} by the exporter")
        if isinstance(want, int) and dim.HasField("dim_value") and dim.dim_value != want:
            raise ExportError(f"{file_name}: {value.name!r} has a dim of {dim.dim_value}, declared {want}")
        if isinstance(want, str):
            dim.dim_param = want
        else:
            dim.dim_value = want


def assert_symbolic(model: onnx.ModelProto, io: dict[str, dict[str, Dims]], file_name: str) -> None:
    """Every saved input and output has its declared dims, and every dynamic one (batch, source_len, past_len,
    present_len: contract.DYNAMIC_DIMS) is symbolic with its declared name."""
    declared = {**io["inputs"], **io["outputs"]}
    for value in [*model.graph.input, *model.graph.output]:
        got = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        if got != declared[value.name] or any(d in DYNAMIC_DIMS and isinstance(g, int) for d, g in zip(declared[value.name], got)):
            raise ExportError(f"{file_name}: {value.name!r} saved with dims {got}, declared {declared[value.name]}")
