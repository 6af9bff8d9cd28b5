"""File names, format version and the graphs' inputs/outputs, declared once as plain data."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from .spec import ModelSpec

FORMAT_VERSION = 2
SUPPORTED_FORMAT_VERSIONS = (1, 2)
CONTRACT_SINCE = 2  # token models' manifests carry their contract (runtime.declared) from this version on

ENCODER_FILE = "encoder.onnx"
DECODER_STEP_FILE = "decoder_step.onnx"
# Optional: the whole greedy loop in one graph (an ONNX Loop around the step), written by exports since format 1.1;
# exports without it load and decode with the step loop.
GREEDY_FILE = "greedy_loop.onnx"
# Optional: a recurrent model's step for beam search, reading what attention reads once per input (exports without
# it expand that once per beam, as before).
BEAM_STEP_FILE = "beam_step.onnx"
MANIFEST_FILE = "manifest.json"
# Token models ship their vocabularies beside the graphs, hashed in the manifest like the graphs.
VOCAB_FILES = {"source": "source_vocab.json", "target": "target_vocab.json"}

CHECKPOINT_SPEC_FILE = "spec.json"
CHECKPOINT_WEIGHTS_FILE = "weights.pt"
CHECKPOINT_HISTORY_FILE = "history.json"
CHECKPOINT_STATE_FILE = "train_state.pt"
CHECKPOINT_PLOT_FILE = "loss.png"
PARTIAL_SUFFIX = ".partial"  # an interrupted run's state sits in `<out>.partial/train_state.pt` until it finishes


def partial_dir(out: str | Path) -> Path:
    """Where an in-progress run keeps its training state: `<out>.partial`."""
    out = Path(out)
    return out.with_name(out.name + PARTIAL_SUFFIX)


BATCH = "batch"
SOURCE_LEN = "source_len"
PAST_LEN = "past_len"  # transformer self-attention cache: tokens decoded so far
PRESENT_LEN = "present_len"  # the grown cache a step returns: past_len + 1
DECODE_LEN = "decode_len"  # the greedy loop graph: steps run (points: target_len; tokens: until every row ended)
HYPOTHESES = "hypotheses"  # a transformer's beam search graph: the n-best slots per input (num_hypotheses)
ROWS = "rows"  # a beam step's rows: batch x beam, input b owning rows b*k .. b*k + k - 1
DYNAMIC_DIMS = (BATCH, SOURCE_LEN, PAST_LEN, PRESENT_LEN, DECODE_LEN, HYPOTHESES, ROWS)

# Dims are symbolic names (str) or fixed sizes (int).
Dims = list[str | int]
GraphIO = dict[str, dict[str, dict[str, Dims]]]  # file name -> "inputs"/"outputs" -> name -> dims


def encoder_inputs(spec: ModelSpec) -> dict[str, Dims]:
    """Encoder graph inputs: source points and the validity mask (True = real point)."""
    return {
        "source": [BATCH, SOURCE_LEN, spec.n_features],
        "source_mask": [BATCH, 1, SOURCE_LEN],
    }


def encoder_outputs(spec: ModelSpec) -> dict[str, Dims]:
    """Encoder graph outputs: what the first decoder step needs, keys projected once here."""
    out: dict[str, Dims] = {
        "hidden": [1, BATCH, spec.hidden_dim],
        "decoder_input": [BATCH, 1, spec.n_features],
    }
    out.update(attention_states(spec))
    return out


def attention_states(spec: ModelSpec) -> dict[str, Dims]:
    """Encoder states the attention reads at every step (empty without attention)."""
    # keys_t: the projected keys, transposed once here so that no step transposes them.
    if spec.attention == "dot":
        return {
            "keys_t": [BATCH, spec.hidden_dim, SOURCE_LEN],
            "values": [BATCH, SOURCE_LEN, spec.hidden_dim],
        }
    if spec.attention == "multihead":
        return {
            "keys_t": [BATCH, spec.n_heads, spec.hidden_dim, SOURCE_LEN],
            "values": [BATCH, spec.n_heads, SOURCE_LEN, spec.hidden_dim],
        }
    return {}


def decoder_inputs(spec: ModelSpec) -> dict[str, Dims]:
    """Decoder-step graph inputs."""
    out: dict[str, Dims] = {
        "decoder_input": [BATCH, 1, spec.n_features],
        "hidden": [1, BATCH, spec.hidden_dim],
    }
    if spec.has_attention:
        out.update(attention_states(spec))
        out["source_mask"] = [BATCH, 1, SOURCE_LEN]
    return out


def decoder_outputs(spec: ModelSpec) -> dict[str, Dims]:
    """Decoder-step graph outputs; attention weights are per head for multi-head models."""
    out: dict[str, Dims] = {
        "output": [BATCH, 1, spec.n_features],
        "hidden_out": [1, BATCH, spec.hidden_dim],
    }
    if spec.attention == "dot":
        out["alphas"] = [BATCH, 1, SOURCE_LEN]
    elif spec.attention == "multihead":
        out["alphas"] = [BATCH, spec.n_heads, 1, SOURCE_LEN]
    return out


def token_encoder_inputs(spec: ModelSpec) -> dict[str, Dims]:
    """Token encoder inputs: right-padded source ids and each row's length."""
    return {"source_ids": [BATCH, SOURCE_LEN], "source_lengths": [BATCH]}


def transformer_cache(spec: ModelSpec, length: str | int) -> Dims:
    """One self-attention cache tensor (keys or values): every layer's per-head entries for `length` tokens."""
    return [spec.layers, BATCH, spec.n_heads, length, spec.head_dim]


def transformer_state(spec: ModelSpec) -> dict[str, Dims]:
    """What a transformer step reads besides the previous token: the position it decodes, the self-attention cache
    of every layer, the cross-attention keys/values projected once by the encoder, and the source mask."""
    cross = [spec.layers, BATCH, spec.n_heads, SOURCE_LEN, spec.head_dim]
    return {"positions": [BATCH], "past_keys": transformer_cache(spec, PAST_LEN),
            "past_values": transformer_cache(spec, PAST_LEN), "cross_keys": cross, "cross_values": cross,
            "source_mask": [BATCH, SOURCE_LEN]}


def token_decoder_state(spec: ModelSpec) -> dict[str, Dims]:
    """What every token decoder step reads besides the previous token: recurrent state and attention memory."""
    if spec.is_transformer:
        return transformer_state(spec)
    out: dict[str, Dims] = {"hidden": [spec.layers, BATCH, spec.hidden_dim]}
    if spec.cell == "lstm":
        out["cell"] = [spec.layers, BATCH, spec.hidden_dim]
    if spec.attention == "multihead":  # per-head keys and values, projected once in the encoder
        out["keys"] = [BATCH, spec.n_heads, SOURCE_LEN, spec.head_dim]
        out["values"] = [BATCH, spec.n_heads, SOURCE_LEN, spec.head_dim]
    elif spec.has_attention:
        out["keys"] = [BATCH, SOURCE_LEN, spec.hidden_dim]
        out["memory"] = [BATCH, SOURCE_LEN, spec.directions * spec.hidden_dim]
    if spec.has_attention:
        out["source_mask"] = [BATCH, SOURCE_LEN]
    return out


def token_decoder_outputs(spec: ModelSpec) -> dict[str, Dims]:
    """Token step outputs: log-probabilities, the advanced recurrent state or grown cache, attention weights."""
    if spec.is_transformer:  # alphas: the last layer's cross-attention, mean over heads
        return {"log_probs": [BATCH, spec.target_vocab_size], "next_positions": [BATCH],
                "present_keys": transformer_cache(spec, PRESENT_LEN),
                "present_values": transformer_cache(spec, PRESENT_LEN), "alphas": [BATCH, SOURCE_LEN]}
    out: dict[str, Dims] = {"log_probs": [BATCH, spec.target_vocab_size],
                            "hidden_out": [spec.layers, BATCH, spec.hidden_dim]}
    if spec.cell == "lstm":
        out["cell_out"] = [spec.layers, BATCH, spec.hidden_dim]
    if spec.has_attention:  # multi-head models: the mean over heads
        out["alphas"] = [BATCH, SOURCE_LEN]
    return out


# Step outputs fed back as the next step's inputs (token models).
FEEDBACK = {"hidden_out": "hidden", "cell_out": "cell", "next_positions": "positions",
            "present_keys": "past_keys", "present_values": "past_values"}


def token_encoder_outputs(spec: ModelSpec) -> dict[str, Dims]:
    """Everything the first step reads, plus the encoder's memory. A transformer's encoder also returns the first
    step's position (0) and an empty cache (past_len 0), so a runtime needs no model-specific set-up."""
    state = token_decoder_state(spec)
    if spec.is_transformer:
        state = {**state, "past_keys": transformer_cache(spec, 0), "past_values": transformer_cache(spec, 0)}
        return {**state, "memory": [BATCH, SOURCE_LEN, spec.d_model]}
    # memory is an encoder output even without attention: the graph then keeps the recurrent op's sequence
    # output (the exporter fails on a bidirectional LSTM whose sequence output is unused).
    return {**state, "memory": [BATCH, SOURCE_LEN, spec.directions * spec.hidden_dim]}


def state_batch_axes(spec: ModelSpec) -> dict[str, int]:
    """The batch axis of every decoder state entry, so beam search can reorder any model's state by index."""
    return {name: dims.index(BATCH) for name, dims in token_decoder_state(spec).items()}


def point_graph_io(spec: ModelSpec) -> GraphIO:
    """A point model's encoder and step: source points in, the next point and hidden state out."""
    return {
        ENCODER_FILE: {"inputs": encoder_inputs(spec), "outputs": encoder_outputs(spec)},
        DECODER_STEP_FILE: {"inputs": decoder_inputs(spec), "outputs": decoder_outputs(spec)},
    }


def token_graph_io(spec: ModelSpec) -> GraphIO:
    """A token model's encoder and step: source ids in, log-probs and the fed-back state out."""
    return {
        ENCODER_FILE: {"inputs": token_encoder_inputs(spec), "outputs": token_encoder_outputs(spec)},
        DECODER_STEP_FILE: {"inputs": {"previous_tokens": [BATCH], **token_decoder_state(spec)},
                            "outputs": token_decoder_outputs(spec)},
    }


def point_greedy_io(spec: ModelSpec) -> dict[str, dict[str, Dims]]:
    """Points: every step input, `target_len` (int64 scalar, >= 1) -> outputs (batch, decode_len, F) and alphas."""
    out: dict[str, Dims] = {"outputs": [BATCH, DECODE_LEN, spec.n_features]}
    if spec.attention == "dot":
        out["alphas"] = [BATCH, DECODE_LEN, SOURCE_LEN]
    elif spec.attention == "multihead":
        out["alphas"] = [BATCH, spec.n_heads, DECODE_LEN, SOURCE_LEN]
    return {"inputs": {**decoder_inputs(spec), "target_len": []}, "outputs": out}


def token_greedy_io(spec: ModelSpec) -> dict[str, dict[str, Dims]]:
    """Tokens: every step state input, `max_length` (>= 1) and `min_length` (eos is forbidden while fewer tokens are
    decoded) -> tokens (batch, decode_len; after a row's eos: 0 = <pad>), token_log_probs (the chosen tokens'
    log-probs, 0 after eos) and alphas. decode_len is where the loop stopped: max_length, or the step at which every
    row had emitted eos."""
    out: dict[str, Dims] = {"tokens": [BATCH, DECODE_LEN], "token_log_probs": [BATCH, DECODE_LEN]}
    if spec.has_attention:
        out["alphas"] = [BATCH, DECODE_LEN, SOURCE_LEN]
    return {"inputs": {**token_decoder_state(spec), "max_length": [], "min_length": []}, "outputs": out}


class Declared(NamedTuple):
    """One model kind's declarations: its two graphs, and the greedy loop graph around its step."""

    graphs: Callable[[ModelSpec], GraphIO]
    greedy: Callable[[ModelSpec], dict[str, dict[str, Dims]]]


# The one place a spec's kind picks what its graphs take and give.
DECLARED = {"points": Declared(point_graph_io, point_greedy_io), "tokens": Declared(token_graph_io, token_greedy_io)}


def graph_io(spec: ModelSpec) -> GraphIO:
    """Both graphs' declared inputs and outputs, keyed by file name."""
    return DECLARED[spec.kind].graphs(spec)


def greedy_io(spec: ModelSpec) -> dict[str, dict[str, Dims]]:
    """The greedy loop graph: the step's encoder-made state and a length in, the decoded sequence out."""
    return DECLARED[spec.kind].greedy(spec)


# Keys of each graph's metadata_props (shown by Netron; the runtime checks the export id).
EXPORT_ID_KEY = "seq2onnx.export_id"
SPEC_KEY = "seq2onnx.spec"
GRAPH_KEY = "seq2onnx.graph"


# A transformer's fast graphs (built by `export.tokens.fast`): the same decode as the traced graphs with a per-layer
# state, one encoder and two step/greedy pairs over it: onnxruntime's fused `com.microsoft` kernels (fewest nodes:
# small batches) and batched MatMuls ("wide": faster from WIDE_ROWS rows up). Optional; no attention weights.
# fold_greedy/fold_beam: the one-call greedy and beam graphs with the cross-attention folded, for calls of at most
# optional_graphs.fold_tokens source tokens (small models only; fast_greedy/fast_beam run the rest); fold_few_beam:
# fold_beam with its loop in segments (no If a step), for such calls of at most token_steps.FEW_BEAM_INPUTS inputs.
FAST_FILES = {"encoder": "fast_encoder.onnx", "step": "fast_decoder_step.onnx", "greedy": "fast_greedy.onnx",
              "beam": "fast_beam.onnx", "wide_step": "wide_decoder_step.onnx", "wide_greedy": "wide_greedy.onnx",
              "wide_beam": "wide_beam.onnx", "fold_greedy": "fold_greedy.onnx", "fold_beam": "fold_beam.onnx",
              "fold_few_beam": "fold_few_beam.onnx"}
