"""Write the two ONNX graphs with declared names and symbolic dims, and check them."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import onnx
import torch

from runtime.contract import (
    BATCH,
    DECODER_STEP_FILE,
    DYNAMIC_DIMS,
    ENCODER_FILE,
    EXPORT_ID_KEY,
    FEEDBACK,
    GRAPH_KEY,
    GREEDY_FILE,
    PAST_LEN,
    PRESENT_LEN,
    SOURCE_LEN,
    SPEC_KEY,
    Dims,
    graph_io,
    greedy_io,
)
from runtime.spec import N_SPECIAL_TOKENS, ModelSpec
from training.models import EncoderDecoder
from training.token_base import BOS_ID, TokenModel

from .errors import ExportError
from .fused import write_greedy_graph
from .token_wrappers import TokenEncoderGraph, TokenStepGraph
from .wrappers import DecoderStepGraph, EncoderGraph

Model = EncoderDecoder | TokenModel

MIN_OPSET, MAX_OPSET = 14, 20
# Examples of batch >= 2 and length >= 2, so no exporter can mistake a dim for a constant.
EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN = 3, 5
EXAMPLE_LENGTHS = (5, 2, 4)  # token models: right-padded rows of unequal length
# Token models: the step is traced on the state after this many steps, so a transformer's cache is not empty (0)
# and does not grow to 1 in the example either.
EXAMPLE_PAST_LEN = 2
EXAMPLE_SIZES = {BATCH: EXAMPLE_BATCH, SOURCE_LEN: EXAMPLE_SOURCE_LEN, PAST_LEN: EXAMPLE_PAST_LEN,
                 PRESENT_LEN: EXAMPLE_PAST_LEN + 1}
# A transformer's position table must hold the examples' positions: every source token, and the traced step's.
MIN_EXPORT_POSITIONS = max(EXAMPLE_SOURCE_LEN, EXAMPLE_PAST_LEN + 1)

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
TRANSFORMER_DOCS = {
    ENCODER_FILE: "seq2onnx transformer encoder: run once per request. source_ids (batch, source_len; right-padded "
    "with 0; at most max_positions) and source_lengths (batch) -> memory, every decoder layer's cross_keys/"
    "cross_values (layers, batch, heads, source_len, head_dim), source_mask, and the first step's state: positions "
    "(zeros) and an empty self-attention cache past_keys/past_values (layers, batch, heads, 0, head_dim).",
    DECODER_STEP_FILE: "seq2onnx transformer decoder step: run once per output token; it projects only the new token "
    "and attends over the cache. previous_tokens (batch; 1 = bos at the first step) at positions (batch; < "
    "max_positions), past_keys/past_values (layers, batch, heads, past_len, head_dim), cross_keys/cross_values and "
    "source_mask -> log_probs (batch, vocab) and alphas (batch, source_len: the last layer's cross-attention, mean "
    "over heads); feed next_positions back as positions and present_keys/present_values (present_len = past_len + "
    "1) back as past_keys/past_values. Beam search reorders every state input along its batch axis (1 for the "
    "caches).",
}


GREEDY_DOCS = {
    "points": "seq2onnx greedy loop: the decoder step in an ONNX Loop, run once per request after the encoder. The "
    "encoder's outputs and source_mask, and target_len (int64 scalar, >= 1) -> outputs (batch, decode_len, F) and "
    "alphas, decode_len = target_len.",
    "tokens": "seq2onnx greedy loop: the decoder step in an ONNX Loop, run once per request after the encoder; the "
    "first token is bos, each next one the argmax (ties: lowest id). The encoder's state, max_length (int64 scalar, "
    ">= 1) and min_length (eos forbidden while fewer tokens are decoded) -> tokens (batch, decode_len; after a row's "
    "eos: 0), token_log_probs (0 after eos) and alphas; the loop stops at max_length or once every row emitted eos.",
}


def graph_docs(spec: ModelSpec) -> dict[str, str]:
    """Each graph's doc string (shown by Netron): how to feed it and what to feed back."""
    greedy = {GREEDY_FILE: GREEDY_DOCS[spec.kind]}
    if spec.kind != "tokens":
        return {**DOCS, **greedy}
    return {**(TRANSFORMER_DOCS if spec.is_transformer else TOKEN_DOCS), **greedy}


def dynamic_axes(io: dict[str, Dims]) -> dict[str, dict[int, str]]:
    """Exporter form of the declared dims: {name: {axis: symbolic name}}."""
    return {name: {i: d for i, d in enumerate(dims) if isinstance(d, str)} for name, dims in io.items()}


def graph_modules(model: Model, spec: ModelSpec) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Each graph's export module and example arguments, the encoder's outputs feeding the step."""
    if spec.is_transformer and spec.max_positions < MIN_EXPORT_POSITIONS:
        raise ExportError(f"spec field 'max_positions' is {spec.max_positions}: the graphs are traced on "
                          f"{EXAMPLE_SOURCE_LEN}-token example sources, so a transformer needs max_positions >= "
                          f"{MIN_EXPORT_POSITIONS} to be exported; train it with a larger position table")
    if spec.kind == "tokens":
        encoder, step = TokenEncoderGraph(model, spec), TokenStepGraph(model, spec)
        gen = torch.Generator().manual_seed(0)
        enc_args = (torch.randint(N_SPECIAL_TOKENS, spec.source_vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN),
                                  generator=gen),
                    torch.tensor(EXAMPLE_LENGTHS))  # unequal lengths: the packed path is what gets traced
        extra = {"previous_tokens": torch.full((EXAMPLE_BATCH,), BOS_ID)}
        steps = EXAMPLE_PAST_LEN
    else:
        encoder, step = EncoderGraph(model, spec), DecoderStepGraph(model, spec)
        gen = torch.Generator().manual_seed(0)
        mask = torch.ones(EXAMPLE_BATCH, 1, EXAMPLE_SOURCE_LEN, dtype=torch.bool)
        enc_args = (torch.randn(EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN, spec.n_features, generator=gen), mask)
        extra = {"source_mask": mask}
        steps = 0
    io = graph_io(spec)
    with torch.no_grad():
        states = dict(zip(encoder.output_names, encoder(*enc_args)))
    check_example_shapes("encoder output", io[ENCODER_FILE]["outputs"], states)
    states.update(extra)
    inputs, outputs = io[DECODER_STEP_FILE]["inputs"], list(io[DECODER_STEP_FILE]["outputs"])
    for _ in range(steps):  # advance the example state, fed back by the contract, as the runtime does
        with torch.no_grad():
            produced = dict(zip(outputs, step(*(states[name] for name in inputs))))
        states.update({FEEDBACK[name]: value for name, value in produced.items() if name in FEEDBACK})
    check_example_shapes("decoder step input", inputs, states)  # a cache grown by one per step: past_len 2
    step_args = tuple(states[name] for name in inputs)
    return {ENCODER_FILE: (encoder, enc_args), DECODER_STEP_FILE: (step, step_args)}


def check_example_shapes(what: str, declared: dict[str, Dims], states: dict[str, torch.Tensor]) -> None:
    """Example tensors have the declared shapes, symbolic dims at the example sizes (EXAMPLE_SIZES)."""
    for name, dims in declared.items():
        shape = [EXAMPLE_SIZES.get(d, d) for d in dims]
        if list(states[name].shape) != shape:
            raise ExportError(f"{what} {name!r}: expected example shape {shape}, got {list(states[name].shape)}")


def export_graphs(model: Model, spec: ModelSpec, out_dir: Path, opset: int, export_id: str) -> None:
    """Export encoder.onnx and decoder_step.onnx into out_dir, then fix up and check them."""
    model.eval()
    modules = graph_modules(model, spec)
    for file_name, io in graph_io(spec).items():
        module, args = modules[file_name]
        module.eval()  # the exporter restores the module's mode afterwards: a wrapper left in training mode would
        # switch the model's dropout back on for the parity checks that follow
        path = out_dir / file_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about python ints; dims are checked below
            torch.onnx.export(
                module, args, str(path), input_names=list(io["inputs"]), output_names=list(io["outputs"]),
                dynamic_axes={**dynamic_axes(io["inputs"]), **dynamic_axes(io["outputs"])},
                opset_version=opset, dynamo=False, do_constant_folding=True,
            )
        finish_graph(path, io, spec, export_id, file_name)
    export_greedy(out_dir, spec, export_id)


def export_greedy(out_dir: Path, spec: ModelSpec, export_id: str) -> None:
    """Write greedy_loop.onnx around out_dir's (final) decoder step, with the same metadata and checks."""
    path = write_greedy_graph(out_dir, spec)
    finish_graph(path, greedy_io(spec), spec, export_id, GREEDY_FILE)


def finish_graph(path: Path, io: dict[str, dict[str, Dims]], spec: ModelSpec, export_id: str, file_name: str) -> None:
    """Set declared shapes and metadata, then assert symbolic dims and run the full checker."""
    model = onnx.load(str(path))
    for value in [*model.graph.input, *model.graph.output]:
        declared = {**io["inputs"], **io["outputs"]}[value.name]
        set_dims(value, declared, file_name)
    docs = graph_docs(spec)
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
