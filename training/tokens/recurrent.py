"""Recurrent token models: embeddings, a GRU/LSTM encoder (layers, optionally bidirectional) and an attention decoder.

Padding: sources are right-padded with PAD_ID and come with their lengths; the encoder packs them
(`pack_padded_sequence`), which the legacy ONNX exporter turns into the native GRU/LSTM op with `sequence_lens`
(measured: <= 1.8e-7 from PyTorch for GRU/LSTM, 1-2 layers, uni/bidirectional, with symbolic batch and length).

Bridge rule (bidirectional encoders): the decoder's initial state for layer l is
    h_l = tanh(W_h [h_l(forward); h_l(backward)] + b_h)      and, for LSTM,  c_l = W_c [c_l(fw); c_l(bw)] + b_c
(cell states are unbounded, so no squashing). Unidirectional encoders hand their final states over unchanged.

Attention over the encoder memory m (N, L, D), D = directions * hidden, with the decoder's top hidden state q:
    dot:       score = q . (W_k m)                         (keys projected once, in the encoder)
    additive:  score = v . tanh(W_q q + W_k m)             (Bahdanau; W_k m projected once, in the encoder)
    multihead: score_h = (W_q q)_h . (W_k m)_h / sqrt(d_k) per head, context W_o [sum(alpha_h (W_v m)_h)]_h
padded positions get -inf before the softmax; the context is sum(alpha * m) (multihead: as above).
The step's output is log_softmax(W_o [h_top; context]) (or, with tied embeddings, of P [h_top; context] . E^T), with
<pad> and <s> pushed to probability 0: they are never outputs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from runtime.spec import ModelSpec

from .base import (
    BOS_ID,
    EOS_ID,
    NEVER_LOGIT,
    PAD_ID,
    TensorState,
    TokenModel,
    never_output,
    torch_steps,
)

__all__ = ["BOS_ID", "EOS_ID", "NEVER_LOGIT", "PAD_ID", "TokenSeq2Seq", "sequence_loss", "torch_steps"]
RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM}
# (layers, N, H) hidden, and for LSTM the (layers, N, H) cell state; GRU carries None.
State = tuple[torch.Tensor, torch.Tensor | None]


class TokenEncoder(nn.Module):
    """Embeds source ids and runs a packed GRU/LSTM; returns memory (N, L, D) and the decoder's initial state."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = nn.Embedding(spec.source_vocab_size, spec.embedding_dim, padding_idx=PAD_ID)
        self.rnn = RNN_CLASSES[spec.cell](spec.embedding_dim, spec.hidden_dim, num_layers=spec.layers,
                                          bidirectional=spec.bidirectional, batch_first=True)
        both = 2 * spec.hidden_dim
        self.bridge_h = nn.Linear(both, spec.hidden_dim) if spec.bidirectional else None
        self.bridge_c = nn.Linear(both, spec.hidden_dim) if spec.bidirectional and spec.cell == "lstm" else None

    def forward(self, source: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, State]:
        """source (N, L) int64 right-padded, lengths (N,) -> memory (N, L, D), (h, c) each (layers, N, H)."""
        packed = pack_padded_sequence(self.embedding(source), lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=source.shape[1])  # (N, L, D)
        h, c = final if isinstance(final, tuple) else (final, None)  # (layers * dirs, N, H)
        return memory, (self._bridge(h, self.bridge_h, torch.tanh), self._bridge(c, self.bridge_c, None))

    def _bridge(self, state: torch.Tensor | None, linear: nn.Linear | None, squash: object) -> torch.Tensor | None:
        if state is None or linear is None:
            return state
        n = state.shape[1]
        pairs = state.view(self.spec.layers, 2, n, self.spec.hidden_dim)  # (layers, dirs, N, H)
        joined = torch.cat([pairs[:, 0], pairs[:, 1]], dim=-1)  # (layers, N, 2H)
        return squash(linear(joined)) if squash is not None else linear(joined)


class TokenAttention(nn.Module):
    """Dot or additive attention; `project` runs once per source, `forward` once per step."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.kind = spec.attention
        self.key = nn.Linear(spec.directions * spec.hidden_dim, spec.hidden_dim, bias=self.kind == "additive")
        if self.kind == "additive":
            self.query = nn.Linear(spec.hidden_dim, spec.hidden_dim, bias=False)
            self.v = nn.Linear(spec.hidden_dim, 1, bias=False)

    def project(self, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        """memory (N, L, D) -> keys (N, L, H), and the memory itself as values."""
        return {"keys": self.key(memory), "memory": memory}

    def forward(self, query: torch.Tensor, states: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """query (N, H), keys (N, L, H), memory (N, L, D), source_mask (N, L) -> context (N, D), alphas (N, L)."""
        keys = states["keys"]
        if self.kind == "additive":
            scores = self.v(torch.tanh(self.query(query)[:, None, :] + keys)).squeeze(-1)  # (N, L)
        else:
            scores = torch.bmm(keys, query[:, :, None]).squeeze(-1)  # (N, L)
        alphas = torch.softmax(scores.masked_fill(~states["source_mask"], float("-inf")), dim=-1)  # (N, L)
        return torch.bmm(alphas[:, None, :], states["memory"]).squeeze(1), alphas  # (N, D), (N, L)

    def folded(self, query: torch.Tensor, states: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` for k queries per source (a beam's rows): query (B, k, H) against keys (B, L, H), memory
        (B, L, D) and source_mask (B, L) held once per source -> context (B, k, D), alphas (B, k, L)."""
        keys = states["keys"]
        if self.kind == "additive":
            scores = self.v(torch.tanh(self.query(query)[:, :, None, :] + keys[:, None])).squeeze(-1)  # (B, k, L)
        else:
            scores = torch.bmm(query, keys.transpose(1, 2))  # (B, k, L)
        alphas = torch.softmax(scores.masked_fill(~states["source_mask"][:, None, :], float("-inf")), dim=-1)
        return torch.bmm(alphas, states["memory"]), alphas  # (B, k, D), (B, k, L)


class MultiHeadTokenAttention(nn.Module):
    """Multi-head attention: each of `n_heads` heads scores (W_q q)_h . (W_k m)_h / sqrt(d_k) over its own
    d_k = hidden_dim / n_heads dims; the heads' contexts are concatenated and projected (W_o). Keys and values are
    projected once per source. The attention returned is the mean of the heads' weights."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.heads, self.d_k = spec.n_heads, spec.head_dim
        memory_dim = spec.directions * spec.hidden_dim
        self.query = nn.Linear(spec.hidden_dim, spec.hidden_dim)
        self.key = nn.Linear(memory_dim, spec.hidden_dim)
        self.value = nn.Linear(memory_dim, spec.hidden_dim)
        self.out = nn.Linear(spec.hidden_dim, spec.hidden_dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, length = x.shape[0], x.shape[1]
        return x.view(n, length, self.heads, self.d_k).transpose(1, 2)  # (N, heads, L, d_k)

    def project(self, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        """memory (N, L, D) -> per-head keys and values, each (N, heads, L, d_k)."""
        return {"keys": self._split(self.key(memory)), "values": self._split(self.value(memory))}

    def forward(self, query: torch.Tensor, states: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """query (N, H), keys/values (N, heads, L, d_k), source_mask (N, L) -> context (N, H), alphas (N, L)."""
        q = self.query(query).view(-1, self.heads, 1, self.d_k)  # (N, heads, 1, d_k)
        scores = torch.matmul(q, states["keys"].transpose(2, 3)) / math.sqrt(self.d_k)  # (N, heads, 1, L)
        masked = scores.masked_fill(~states["source_mask"][:, None, None, :], float("-inf"))
        alphas = torch.softmax(masked, dim=-1)  # (N, heads, 1, L)
        context = torch.matmul(alphas, states["values"])  # (N, heads, 1, d_k)
        joined = context.squeeze(2).flatten(1)  # (N, H)
        return self.out(joined), alphas.squeeze(2).mean(dim=1)  # (N, H), (N, L)

    def folded(self, query: torch.Tensor, states: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` for k queries per source: query (B, k, H), keys/values (B, heads, L, d_k) and source_mask
        (B, L) held once per source -> context (B, k, H), alphas (B, k, L)."""
        b, k = query.shape[0], query.shape[1]
        q = self.query(query).view(b, k, self.heads, self.d_k).transpose(1, 2)  # (B, heads, k, d_k)
        scores = torch.matmul(q, states["keys"].transpose(2, 3)) / math.sqrt(self.d_k)  # (B, heads, k, L)
        alphas = torch.softmax(scores.masked_fill(~states["source_mask"][:, None, None, :], float("-inf")), dim=-1)
        context = torch.matmul(alphas, states["values"])  # (B, heads, k, d_k)
        joined = context.transpose(1, 2).reshape(b, k, -1)  # (B, k, H)
        return self.out(joined), alphas.mean(dim=1)  # (B, k, H), (B, k, L)


def build_attention(spec: ModelSpec) -> nn.Module | None:
    """The attention module a spec asks for (None without attention)."""
    if spec.attention == "multihead":
        return MultiHeadTokenAttention(spec)
    return TokenAttention(spec) if spec.has_attention else None


def context_dim(spec: ModelSpec) -> int:
    """Width of the attention context concatenated to the decoder's output."""
    if spec.attention == "multihead":
        return spec.hidden_dim
    return spec.directions * spec.hidden_dim if spec.has_attention else 0


class TokenDecoder(nn.Module):
    """One step at a time: embed the previous token, advance the GRU/LSTM, attend, project to log-probs."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = nn.Embedding(spec.target_vocab_size, spec.embedding_dim, padding_idx=PAD_ID)
        self.rnn = RNN_CLASSES[spec.cell](spec.embedding_dim, spec.hidden_dim, num_layers=spec.layers,
                                          batch_first=True)
        self.attention = build_attention(spec)
        features = spec.hidden_dim + context_dim(spec)
        if spec.tie_embeddings:
            self.pre_output = nn.Linear(features, spec.embedding_dim)
        else:
            self.output = nn.Linear(features, spec.target_vocab_size)
        # <pad> and <s> are never outputs: a constant added to the logits keeps every search and sampler off them
        # (not saved: checkpoints hold the same tensors as before).
        self.register_buffer("never_output", never_output(spec.target_vocab_size), persistent=False)

    def step(self, previous: torch.Tensor, state: State,
             attend: dict[str, torch.Tensor]) -> tuple[torch.Tensor, State, torch.Tensor | None]:
        """previous (N,) ids, state (layers, N, H) x2, and what attention reads (the contract's names: keys,
        memory or values, source_mask) -> log_probs (N, V), new state, alphas (N, L) or None."""
        features, state = self.advance(previous, state)  # (N, H)
        context, alphas = self.attention(features, attend) if self.attention is not None else (None, None)
        return self.emit(features, context), state, alphas

    def folded_step(self, previous: torch.Tensor, state: State,
                    attend: dict[str, torch.Tensor]) -> tuple[torch.Tensor, State, torch.Tensor]:
        """`step` for a beam's rows: previous (R,) and state (layers, R, H) for R = B x k rows, input b owning rows
        b*k .. b*k + k - 1, with what attention reads held once per input (B, ...): an input's k queries attend
        together (`TokenAttention.folded`). Needs attention."""
        features, state = self.advance(previous, state)  # (R, H)
        context, alphas = self.attention.folded(features.view(attend["source_mask"].shape[0], -1,
                                                              features.shape[-1]), attend)  # (B, k, D), (B, k, L)
        return self.emit(features, context.flatten(0, 1)), state, alphas.flatten(0, 1)

    def advance(self, previous: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """previous (N,) ids and state -> the top layer's output (N, H) and the new state."""
        h, c = state
        out, final = self.rnn(self.embedding(previous)[:, None, :], h if c is None else (h, c))  # (N, 1, H)
        h, c = final if isinstance(final, tuple) else (final, None)
        return out[:, 0], (h, c)

    def emit(self, features: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """The top layer's output (N, H) and the attention's context (N, D) or None -> log_probs (N, V)."""
        if context is not None:
            features = torch.cat([features, context], dim=-1)  # (N, H + D)
        return F.log_softmax(self._logits(features), dim=-1)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        """(N, V): the never-output constant rides in the product's bias (one Gemm a step in the graphs, no Add)."""
        if self.spec.tie_embeddings:
            return torch.addmm(self.never_output, self.pre_output(features), self.embedding.weight.T)
        return F.linear(features, self.output.weight, self.output.bias + self.never_output)


class TokenSeq2Seq(TokenModel):
    """Encoder + decoder; `forward` is teacher-forced and returns log-probs for every target position."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.kind != "tokens":
            raise ValueError(f"TokenSeq2Seq needs a spec of kind 'tokens', got {spec.kind!r}")
        self.spec = spec
        self.encoder = TokenEncoder(spec)
        self.decoder = TokenDecoder(spec)

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor | None]:
        """Everything the decoder steps read, by the contract's names: hidden, cell (None for GRU), memory,
        source_mask (N, L), and the attention's projections (keys, values)."""
        memory, (h, c) = self.encoder(source, lengths)
        mask = torch.arange(source.shape[1], device=source.device)[None, :] < lengths[:, None]  # (N, L)
        out = {"hidden": h, "cell": c, "memory": memory, "source_mask": mask}
        if self.decoder.attention is not None:
            out.update(self.decoder.attention.project(memory))
        return out

    def step(self, previous: torch.Tensor,
             state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        """previous (N,) ids and the state by the contract's names -> log_probs (N, V), next state, alphas (N, L)."""
        log_probs, (h, c), alphas = self.decoder.step(previous, (state["hidden"], state.get("cell")), state)
        return log_probs, {**state, "hidden": h, **({} if c is None else {"cell": c})}, alphas

    def folded_step(self, previous: torch.Tensor,
                    state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor]:
        """`step` for beam search's rows, what attention reads held once per input (`TokenDecoder.folded_step`)."""
        log_probs, (h, c), alphas = self.decoder.folded_step(previous, (state["hidden"], state.get("cell")), state)
        return log_probs, {**state, "hidden": h, **({} if c is None else {"cell": c})}, alphas

    def forward(self, source: torch.Tensor, lengths: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: target_in (N, T) starts with BOS -> log_probs (N, T, V) for target_in shifted by one."""
        enc = self.encode(source, lengths)
        state: State = (enc["hidden"], enc["cell"])
        steps = []
        for t in range(target_in.shape[1]):
            log_probs, state, _ = self.decoder.step(target_in[:, t], state, enc)
            steps.append(log_probs)
        return torch.stack(steps, dim=1)  # (N, T, V)


def sequence_loss(log_probs: torch.Tensor, target_out: torch.Tensor, label_smoothing: float = 0.0,
                  reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over real (non-PAD) target tokens, their mean (or with reduction="sum" their sum);
    log_probs (N, T, V), target_out (N, T)."""
    # cross_entropy re-normalises its input; log-probs are already normalised, so this is plain NLL (+ smoothing).
    return F.cross_entropy(log_probs.flatten(0, 1), target_out.flatten(), ignore_index=PAD_ID,
                           label_smoothing=label_smoothing, reduction=reduction)
