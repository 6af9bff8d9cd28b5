"""Export modules for token models, with flat tensor arguments named by the contract. They reuse the model's own
`encode` and `step`, so the graphs compute exactly what the PyTorch reference decode does, for any token model; a
recurrent GRU model's step differs only in how its GRU advances: through `cells.ExplicitGRU` (Gemms and gate
arithmetic, its first layer's input products looked up per token), which onnxruntime's CPU kernels run faster than
a GRU op of length 1 (benchmarks/cpu_step_bench.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from export.cells import ExplicitGRU
from export.errors import ExportError
from export.examples import (
    EXAMPLE_BATCH,
    EXAMPLE_BEAM,
    EXAMPLE_LENGTHS,
    EXAMPLE_PAST_LEN,
    EXAMPLE_SOURCE_LEN,
    MIN_EXPORT_POSITIONS,
    Traced,
)
from runtime.contract import (
    BEAM_STEP_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FAST_FILES,
    FEEDBACK,
    GREEDY_FILE,
    ROWS,
    graph_io,
    token_decoder_outputs,
    token_decoder_state,
)
from runtime.optional_graphs import token_beam_step_io
from runtime.spec import N_SPECIAL_TOKENS, ModelSpec
from training.tokens.base import BOS_ID, TensorState, TokenModel
from training.tokens.recurrent import TokenSeq2Seq


class TokenEncoderGraph(nn.Module):
    """source_ids (N, L) int64, source_lengths (N,) int64 -> the first step's state and the memory."""

    def __init__(self, model: TokenModel, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.output_names = list(graph_io(spec)[ENCODER_FILE]["outputs"])

    def forward(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.encode(source_ids, source_lengths)
        return tuple(states[name] for name in self.output_names)


class TokenStepGraph(nn.Module):
    """One step: previous_tokens (N,) and the state -> log_probs (N, V), the fed-back state, alphas. `folded`
    (recurrent models with attention): the beam step, whose rows are batch x beam and whose attention reads its
    inputs once per input (`TokenSeq2Seq.folded_step`; optional_graphs.token_beam_step_io)."""

    def __init__(self, model: TokenModel, spec: ModelSpec, folded: bool = False) -> None:
        super().__init__()
        self.model, self.folded = model, folded
        gru = isinstance(model, TokenSeq2Seq) and spec.cell == "gru"  # an LSTM keeps its op: as fast (cells.py)
        self.cell = ExplicitGRU(model.decoder.rnn, model.decoder.embedding) if gru else None
        self.input_names = ["previous_tokens", *token_decoder_state(spec)]
        self.output_names = list(token_decoder_outputs(spec))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.input_names, inputs))
        previous = feed.pop("previous_tokens")
        if self.cell is None:
            log_probs, state, alphas = (self.model.folded_step if self.folded else self.model.step)(previous, feed)
        else:
            log_probs, state, alphas = self.gru_step(previous, feed)
        produced = {"log_probs": log_probs, "alphas": alphas}
        produced.update({out: state[into] for out, into in FEEDBACK.items() if into in state})
        return tuple(produced[name] for name in self.output_names)

    def gru_step(self, previous: torch.Tensor,
                 state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        """`TokenSeq2Seq.step` (or `folded_step`) with the explicit cell in place of the GRU."""
        decoder = self.model.decoder
        features, hidden = self.cell(previous, state["hidden"])  # (N, H), (layers, N, H)
        context = alphas = None
        if self.folded:
            queries = features.view(state["source_mask"].shape[0], -1, features.shape[-1])  # (B, k, H)
            context, alphas = (x.flatten(0, 1) for x in decoder.attention.folded(queries, state))
        elif decoder.attention is not None:
            context, alphas = decoder.attention(features, state)  # (N, D), (N, L)
        return decoder.emit(features, context), {**state, "hidden": hidden}, alphas


RECURRENT_DOCS = {
    ENCODER_FILE: "seq2onnx token encoder: run once per request. source_ids (batch, source_len; right-padded with 0) "
    "and source_lengths (batch) -> the decoder's initial hidden[/cell] state, and the attention's memory, projected "
    "keys and source_mask.",
    DECODER_STEP_FILE: "seq2onnx token decoder step: run once per output token. previous_tokens (batch; 1 = bos at "
    "the first step) and the state -> log_probs (batch, vocab); feed hidden_out[/cell_out] back as hidden[/cell].",
    BEAM_STEP_FILE: "seq2onnx token beam step: the decoder step over beam search's rows (rows = batch x beam, input "
    "b owning rows b*k .. b*k + k - 1). previous_tokens (rows), hidden[/cell] (layers, rows, hidden) and what "
    "attention reads, once per input (keys, memory or values, source_mask: batch first) -> log_probs (rows, "
    "vocab), hidden_out[/cell_out] and alphas (rows, source_len); an input's k queries attend to it together.",
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
FAST_DOCS = {
    FAST_FILES["encoder"]: "seq2onnx transformer fast encoder (onnxruntime com.microsoft kernels): run once per "
    "request. source_ids (batch, source_len; right-padded with 0) and source_lengths (batch) -> the fast step's "
    "first state: positions (zeros), an empty cache past_i (2, batch, heads, 0, head_dim) per decoder layer, each "
    "layer's cross_keys_i/cross_values_i (batch, heads, source_len, head_dim) and memory_lengths (batch, int32).",
    FAST_FILES["step"]: "seq2onnx transformer fast decoder step (onnxruntime com.microsoft kernels): run once per "
    "output token. previous_tokens (batch; 1 = bos first) and the state -> log_probs (batch, vocab); feed "
    "next_positions back as positions and present_i (2, batch, heads, past_len + 1, head_dim) as past_i. No "
    "attention weights: use decoder_step.onnx for those.",
    FAST_FILES["greedy"]: "seq2onnx transformer fast greedy decode (onnxruntime com.microsoft kernels): the "
    "encoder and the greedy loop in one graph. source_ids, source_lengths, max_length (int64 scalar, >= 1) and "
    "min_length (eos forbidden while fewer tokens are decoded) -> tokens (batch, decode_len; after a row's eos: 0) "
    "and token_log_probs (0 after eos); argmax ties: the lowest id.",
    FAST_FILES["beam"]: "seq2onnx transformer beam search (onnxruntime com.microsoft kernels): the encoder and "
    "runtime.search.beam_search's rules in one graph. source_ids, source_lengths, max_length, min_length, "
    "beam_size, num_hypotheses (int64 scalars) and length_penalty (float64 scalar) -> per input, best first: "
    "scores and log_probs (batch, hypotheses; float64), tokens (batch, hypotheses, decode_len; eos excluded) and "
    "lengths; a slot scored -inf holds no hypothesis.",
}
WIDE = (" Attention in batched MatMuls instead of the fused kernels: faster for many rows "
        "(runtime.token_steps.WIDE_ROWS).")
FAST_DOCS.update({FAST_FILES[f"wide_{role}"]: FAST_DOCS[FAST_FILES[role]] + WIDE
                  for role in ("step", "greedy", "beam")})
FOLD = (" The cross-attention folded into per-input matrices made once per call: faster for calls of few source "
        "tokens (runtime.optional_graphs.fold_tokens in all), which the runtime sends here.")
FAST_DOCS.update({FAST_FILES[f"fold_{role}"]: FAST_DOCS[FAST_FILES[role]] + FOLD for role in ("greedy", "beam")})
FAST_DOCS[FAST_FILES["fold_few_beam"]] = FAST_DOCS[FAST_FILES["fold_beam"]] + (
    " Its steps run in an inner Loop that ends at a step that can change an n-best; the finishing work then runs "
    "once (no If a step): faster for calls of few inputs (runtime.token_steps.FEW_BEAM_INPUTS), which the "
    "runtime sends here.")
GREEDY_DOCS = {
    GREEDY_FILE: "seq2onnx greedy loop: the decoder step in an ONNX Loop, run once per request after the encoder; the "
    "first token is bos, each next one the argmax (ties: lowest id). The encoder's state, max_length (int64 scalar, "
    ">= 1) and min_length (eos forbidden while fewer tokens are decoded) -> tokens (batch, decode_len; after a row's "
    "eos: 0), token_log_probs (0 after eos) and alphas; the loop stops at max_length or once every row emitted eos.",
}


DECLARED_DOCS = {
    ENCODER_FILE: "seq2onnx declared model's encoder (a user's own PyTorch model, exported through its declared "
    "contract: manifest.json's 'contract' names every input, output, batch axis and special id). source_ids (batch, "
    "source_len; right-padded) and source_lengths (batch) -> the state the first step reads.",
    DECODER_STEP_FILE: "seq2onnx declared model's decoder step: run once per output token. previous_tokens (batch; "
    "the contract's bos at the first step) and the state -> log_probs (batch, vocab) and NAME_out for each state "
    "NAME the step changes, fed back as NAME; the others are read unchanged (manifest.json's 'contract').",
}


def graph_docs(spec: ModelSpec) -> dict[str, str]:
    """Each graph's doc string (shown by Netron): how to feed it and what to feed back."""
    if spec.is_declared:
        return {**DECLARED_DOCS, **GREEDY_DOCS}
    return {**({**TRANSFORMER_DOCS, **FAST_DOCS} if spec.is_transformer else RECURRENT_DOCS), **GREEDY_DOCS}


def traced(model: TokenModel, spec: ModelSpec) -> Traced:
    """The export modules and seeded example inputs: right-padded ids of unequal lengths (the packed path is what
    gets traced), bos as the first token, the state advanced EXAMPLE_PAST_LEN steps (a transformer's cache grown)."""
    if spec.is_transformer and spec.max_positions < MIN_EXPORT_POSITIONS:
        raise ExportError(f"spec field 'max_positions' is {spec.max_positions}: the graphs are traced on "
                          f"{EXAMPLE_SOURCE_LEN}-token example sources, so a transformer needs max_positions >= "
                          f"{MIN_EXPORT_POSITIONS} to be exported; train it with a larger position table")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(N_SPECIAL_TOKENS, spec.source_vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN),
                        generator=gen)  # (N, Ls)
    return Traced(TokenEncoderGraph(model, spec), TokenStepGraph(model, spec), (ids, torch.tensor(EXAMPLE_LENGTHS)),
                  {"previous_tokens": torch.full((EXAMPLE_BATCH,), BOS_ID)}, steps=EXAMPLE_PAST_LEN)


def beam_step(model: TokenModel, spec: ModelSpec, states: dict[str, torch.Tensor]) -> tuple[nn.Module, tuple]:
    """The beam step's export module and example arguments: the encoder's `states` for EXAMPLE_BATCH inputs, the
    recurrent state repeated for EXAMPLE_BEAM rows per input, what attention reads once per input."""
    io = token_beam_step_io(spec)["inputs"]
    rows = {name: states[name].repeat_interleave(EXAMPLE_BEAM, dim=dims.index(ROWS))
            for name, dims in io.items() if name in states and ROWS in dims}
    feed = {**states, **rows, "previous_tokens": torch.full((EXAMPLE_BATCH * EXAMPLE_BEAM,), BOS_ID)}
    return TokenStepGraph(model, spec, folded=True), tuple(feed[name] for name in io)
