"""The graphs an export may hold beside its encoder and step, declared once as plain data: the greedy loop (its
I/O is `contract.greedy_io`), a recurrent model's beam step, and a transformer's fast graphs (`contract.FAST_FILES`;
the same decode with a per-layer state, in onnxruntime's fused kernels or batched MatMuls)."""
from __future__ import annotations

from .contract import (
    BATCH,
    BEAM_STEP_FILE,
    DECODE_LEN,
    FAST_FILES,
    FEEDBACK,
    GREEDY_FILE,
    HYPOTHESES,
    PAST_LEN,
    PRESENT_LEN,
    ROWS,
    SOURCE_LEN,
    Dims,
    GraphIO,
    greedy_io,
    token_decoder_outputs,
    token_decoder_state,
)
from .spec import ModelSpec

FOLD_UP_TO = 8192  # a call's sources fold where S for all of them, inputs x n_heads x source_len x d_model values a
# layer, is at most this (32 KB): a step's two products do h times the arithmetic of MultiHeadAttention's and save
# its per-(input, head) overhead, which pays for small models and batches only. fast greedy loop, batch 1, 20 steps,
# folded / not (same weights): at h L E = 2048-8192, 0.91-0.96 (d_model 64 with 4 or 8 heads, 128 with 4, 256 with
# 8); at 16384, 0.96-1.01; at 32768, 1.06-1.08; at 131072, 1.16. dates transformer at 29 source tokens: greedy at
# batch 4, 1.03-1.04; beam 5 at batch 8, 1.04-1.07 (1.6 at 200 tokens). One session a side; with eight, at batch 1
# the crossover also moves with the steps: plain / folded 0.95-0.96 at 29 source tokens + 11 steps, 1.04 at 13 + 20.


def fold_tokens(spec: ModelSpec) -> int:
    """The most source tokens a call may hold in all (inputs x source_len) and run the folded graphs."""
    return FOLD_UP_TO // (spec.n_heads * spec.d_model)


def folds(spec: ModelSpec) -> bool:
    """Whether an export holds folded graphs: one input of the model's longest training source folds."""
    return spec.is_transformer and spec.input_len <= fold_tokens(spec)


def has_beam_step(spec: ModelSpec) -> bool:
    """Whether an export of `spec` may hold a beam step: recurrent token models with attention (a transformer's
    beam search runs in its beam graph; without attention nothing is read once per input)."""
    return spec.kind == "tokens" and not spec.is_transformer and spec.has_attention


def token_beam_step_io(spec: ModelSpec) -> dict[str, dict[str, Dims]]:
    """The beam step: the decoder step over `rows` (batch x beam, k consecutive rows per input) where the recurrent
    state (what the step feeds back) has a row per beam and what attention reads (keys, memory or values,
    source_mask) one per input: an input's k queries attend to its one copy together."""
    def per_row(dims: Dims) -> Dims:
        return [ROWS if d == BATCH else d for d in dims]

    fed_back = set(FEEDBACK.values())
    state = {name: per_row(dims) if name in fed_back else dims for name, dims in token_decoder_state(spec).items()}
    outputs = {name: per_row(dims) for name, dims in token_decoder_outputs(spec).items()}
    return {"inputs": {"previous_tokens": [ROWS], **state}, "outputs": outputs}


def optional_graph_io(spec: ModelSpec) -> GraphIO:
    """Graphs an export may also hold, keyed by file name: the greedy loop, a recurrent model's beam step, and a
    transformer's fast graphs."""
    fast = {FAST_FILES[role]: io for role, io in fast_graph_io(spec).items()} if spec.is_transformer else {}
    beam = {BEAM_STEP_FILE: token_beam_step_io(spec)} if has_beam_step(spec) else {}
    return {GREEDY_FILE: greedy_io(spec), **beam, **fast}


def fast_state(spec: ModelSpec, past: str | int = PAST_LEN) -> dict[str, Dims]:
    """The fast step's state: positions, each layer's self-attention cache past_i (2: keys then values), its cross
    keys/values, and the source lengths (int32) the cross-attention masks by."""
    out: dict[str, Dims] = {"positions": [BATCH]}
    for i in range(spec.layers):
        out[f"past_{i}"] = [2, BATCH, spec.n_heads, past, spec.head_dim]
    for i in range(spec.layers):
        out[f"cross_keys_{i}"] = [BATCH, spec.n_heads, SOURCE_LEN, spec.head_dim]
        out[f"cross_values_{i}"] = [BATCH, spec.n_heads, SOURCE_LEN, spec.head_dim]
    out["memory_lengths"] = [BATCH]
    return out


def fast_feedback(spec: ModelSpec) -> dict[str, str]:
    """Fast step outputs fed back as the next step's inputs."""
    return {"next_positions": "positions", **{f"present_{i}": f"past_{i}" for i in range(spec.layers)}}


def fast_graph_io(spec: ModelSpec) -> dict[str, dict[str, dict[str, Dims]]]:
    """The fast graphs' inputs and outputs, keyed by FAST_FILES' roles."""
    sources = {"source_ids": [BATCH, SOURCE_LEN], "source_lengths": [BATCH]}
    step_out: dict[str, Dims] = {"log_probs": [BATCH, spec.target_vocab_size], "next_positions": [BATCH]}
    step_out.update({f"present_{i}": [2, BATCH, spec.n_heads, PRESENT_LEN, spec.head_dim] for i in range(spec.layers)})
    step = {"inputs": {"previous_tokens": [BATCH], **fast_state(spec)}, "outputs": step_out}
    greedy = {"inputs": {**sources, "max_length": [], "min_length": []},
              "outputs": {"tokens": [BATCH, DECODE_LEN], "token_log_probs": [BATCH, DECODE_LEN]}}
    options = {"max_length": [], "min_length": [], "beam_size": [], "num_hypotheses": [], "length_penalty": []}
    beam = {"inputs": {**sources, **options},
            "outputs": {"scores": [BATCH, HYPOTHESES], "log_probs": [BATCH, HYPOTHESES],
                        "tokens": [BATCH, HYPOTHESES, DECODE_LEN], "lengths": [BATCH, HYPOTHESES]}}
    return {"encoder": {"inputs": sources, "outputs": fast_state(spec, 0)}, "step": step, "greedy": greedy,
            "beam": beam, "wide_step": step, "wide_greedy": greedy, "wide_beam": beam, "fold_greedy": greedy,
            "fold_beam": beam, "fold_few_beam": beam}
