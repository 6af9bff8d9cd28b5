"""Write the two ONNX graphs with declared names and symbolic dims, and check them."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import onnx
import torch

from runtime.contract import (
    BATCH, DECODER_STEP_FILE, DYNAMIC_DIMS, ENCODER_FILE, EXPORT_ID_KEY, GRAPH_KEY, SOURCE_LEN, SPEC_KEY, Dims, graph_io,
)
from runtime.spec import ModelSpec
from runtime.spec import N_SPECIAL_TOKENS
from training.models import EncoderDecoder
from training.token_base import BOS_ID, TokenModel

from .errors import ExportError
from .token_wrappers import TokenEncoderGraph, TokenStepGraph
from .wrappers import DecoderStepGraph, EncoderGraph

Model = EncoderDecoder | TokenModel

DEFAULT_OPSET = 17
MIN_OPSET, MAX_OPSET = 14, 20
# Examples of batch >= 2 and length >= 2, so no exporter can mistake a dim for a constant.
EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN = 3, 5
EXAMPLE_LENGTHS = (5, 2, 4)  # token models: right-padded rows of unequal length

DOCS = {
    ENCODER_FILE: "seq2onnx encoder: run once per request. source (batch, source_len, F) and source_mask "
    "(batch, 1, source_len; True = real point) -> decoder's first input and hidden state, and the "
    "attention's projected keys and values.",
    DECODER_STEP_FILE: "seq2onnx decoder step: run once per output point, feeding output/hidden_out back "
    "as decoder_input/hidden.",
}
TOKEN_DOCS = {
    ENCODER_FILE: "seq2onnx token encoder: run once per request. source_ids (batch, source_len; right-padded with 0) "
    "and source_lengths (batch) -> the decoder's initial hidden[/cell] state, and the attention's memory, projected "
    "keys and source_mask.",
    DECODER_STEP_FILE: "seq2onnx token decoder step: run once per output token. previous_tokens (batch; 1 = bos at "
    "the first step) and the state -> log_probs (batch, vocab); feed hidden_out[/cell_out] back as hidden[/cell].",
}


def dynamic_axes(io: dict[str, Dims]) -> dict[str, dict[int, str]]:
    """Exporter form of the declared dims: {name: {axis: symbolic name}}."""
    return {name: {i: d for i, d in enumerate(dims) if isinstance(d, str)} for name, dims in io.items()}


def graph_modules(model: Model, spec: ModelSpec) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Each graph's export module and example arguments, the encoder's outputs feeding the step."""
    if spec.kind == "tokens":
        encoder, step = TokenEncoderGraph(model, spec), TokenStepGraph(model, spec)
        gen = torch.Generator().manual_seed(0)
        enc_args = (torch.randint(N_SPECIAL_TOKENS, spec.source_vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN),
                                  generator=gen),
                    torch.tensor(EXAMPLE_LENGTHS))  # unequal lengths: the packed path is what gets traced
        extra = {"previous_tokens": torch.full((EXAMPLE_BATCH,), BOS_ID)}
    else:
        encoder, step = EncoderGraph(model, spec), DecoderStepGraph(model, spec)
        gen = torch.Generator().manual_seed(0)
        mask = torch.ones(EXAMPLE_BATCH, 1, EXAMPLE_SOURCE_LEN, dtype=torch.bool)
        enc_args = (torch.randn(EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN, spec.n_features, generator=gen), mask)
        extra = {"source_mask": mask}
    with torch.no_grad():
        states = dict(zip(encoder.output_names, encoder(*enc_args)))
    io = graph_io(spec)
    check_example_shapes(io[ENCODER_FILE]["outputs"], states)
    states.update(extra)
    step_args = tuple(states[name] for name in io[DECODER_STEP_FILE]["inputs"])
    return {ENCODER_FILE: (encoder, enc_args), DECODER_STEP_FILE: (step, step_args)}


def check_example_shapes(declared: dict[str, Dims], states: dict[str, torch.Tensor]) -> None:
    """The encoder's example outputs have the declared shapes (symbolic dims at the example sizes)."""
    for name, dims in declared.items():
        shape = [{BATCH: EXAMPLE_BATCH, SOURCE_LEN: EXAMPLE_SOURCE_LEN}.get(d, d) for d in dims]
        if list(states[name].shape) != shape:
            raise ExportError(f"encoder output {name!r}: expected example shape {shape}, got {list(states[name].shape)}")


def export_graphs(model: Model, spec: ModelSpec, out_dir: Path, opset: int, export_id: str) -> None:
    """Export encoder.onnx and decoder_step.onnx into out_dir, then fix up and check them."""
    model.eval()
    modules = graph_modules(model, spec)
    for file_name, io in graph_io(spec).items():
        module, args = modules[file_name]
        path = out_dir / file_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about python ints; dims are checked below
            torch.onnx.export(
                module, args, str(path), input_names=list(io["inputs"]), output_names=list(io["outputs"]),
                dynamic_axes={**dynamic_axes(io["inputs"]), **dynamic_axes(io["outputs"])},
                opset_version=opset, dynamo=False, do_constant_folding=True,
            )
        finish_graph(path, io, spec, export_id, file_name)


def finish_graph(path: Path, io: dict[str, dict[str, Dims]], spec: ModelSpec, export_id: str, file_name: str) -> None:
    """Set declared shapes and metadata, then assert symbolic dims and run the full checker."""
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        declared = {**io["inputs"], **io["outputs"]}[value.name]
        set_dims(value, declared, file_name)
    docs = TOKEN_DOCS if spec.kind == "tokens" else DOCS
    model.doc_string = docs[file_name]
    model.graph.doc_string = docs[file_name]
    for key, val in {SPEC_KEY: json.dumps(spec.to_dict(), sort_keys=True), EXPORT_ID_KEY: export_id, GRAPH_KEY: file_name}.items():
        model.metadata_props.add(key=key, value=val)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    assert_symbolic(onnx.load(str(path)), io, file_name)


def set_dims(value: onnx.ValueInfoProto, declared: Dims, file_name: str) -> None:
    """Replace exporter-generated dim names with the declared ones; a fixed batch/length is an error."""
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
    """Every batch/source_len dim of every saved input and output is symbolic with its declared name."""
    declared = {**io["inputs"], **io["outputs"]}
    for value in [*model.graph.input, *model.graph.output]:
        got = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        if got != declared[value.name] or any(d in DYNAMIC_DIMS and isinstance(g, int) for d, g in zip(declared[value.name], got)):
            raise ExportError(f"{file_name}: {value.name!r} saved with dims {got}, declared {declared[value.name]}")
