"""The transformer token model (Vaswani et al. 2017), from the parts seeds 002 and 003 build: scaled dot-product
attention, multi-head attention, the feed-forward block, layer norm and residuals, positional encodings.

    attention(Q, K, V) = softmax(Q K^T / sqrt(d_k), masked positions at -inf) V     per head, d_k = d_model / heads
    x = embedding(ids) + position(index)                  (no sqrt(d_model) scale: see below)
    norm "pre":  x = x + Drop(SubLayer(LN(x))) per sub-layer, then LN after each stack (stable without warm-up)
    norm "post": x = LN(x + Drop(SubLayer(x))) per sub-layer (the seeds' and the paper's order)
    encoder layer: self-attention (padding mask), feed-forward
    decoder layer: self-attention (causal mask), cross-attention over the encoder memory (padding mask), feed-forward
    output: log_softmax(W_o x) (tied: x E^T), <pad> and <s> pushed to probability 0

Embeddings are N(0, 1) and are not scaled by sqrt(d_model): at small d_model that scale drowns the positional signal
(measured on `reverse`: 0.975 exact after 4 minutes with it, >= 0.99 well inside 3 minutes without).

Decoding one token at a time keeps a cache: each decoder layer's self-attention keys and values of the tokens decoded
so far (layers, N, heads, t, d_k). Step t projects only the new token, appends it and attends over t + 1 entries,
so it costs O(t), and it computes what the full-sequence decoder computes at position t under the causal mask.
The encoder projects every decoder layer's cross-attention keys and values once.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from runtime.spec import ModelSpec

from .base import PAD_ID, TensorState, TokenModel, never_output


def scaled_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       dropout: float, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (N, h, Lq, d), k/v (N, h, Lk, d), mask broadcastable to (N, h, Lq, Lk) with True = attend -> (N, h, Lq, d)
    and the weights (N, h, Lq, Lk) when asked for. Trains through PyTorch's fused kernel; exports and returns weights
    through the same formula written out."""
    if not need_weights and not torch.onnx.is_in_onnx_export():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (N, h, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(F.dropout(weights, dropout, training=dropout > 0), v), weights


class MultiHeadAttention(nn.Module):
    """Seed 002's MultiHeadAttention(heads, input_embed_size): per-head queries, keys and values, concatenated heads
    projected by fc_attn. Keys and values are projected by `project`, so callers can cache them."""

    def __init__(self, heads: int, input_embed_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, input_embed_size // heads, dropout
        self.queries = nn.Linear(input_embed_size, input_embed_size)
        self.keys = nn.Linear(input_embed_size, input_embed_size)
        self.values = nn.Linear(input_embed_size, input_embed_size)
        self.fc_attn = nn.Linear(input_embed_size, input_embed_size)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        n, length = x.shape[0], x.shape[1]
        return x.view(n, length, self.heads, self.head_dim).transpose(1, 2)  # (N, h, L, d)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, L, E) -> keys, values (N, h, L, d) each."""
        return self.split(self.keys(x)), self.split(self.values(x))

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """queries (N, Lq, E), projected keys/values (N, h, Lk, d) -> (N, Lq, E), weights (N, h, Lq, Lk) | None."""
        dropout = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product(self.split(self.queries(queries)), keys, values, mask, dropout,
                                          need_weights)
        n, length = queries.shape[0], queries.shape[1]
        return self.fc_attn(out.transpose(1, 2).reshape(n, length, -1)), weights  # (N, Lq, E)


class FeedForward(nn.Module):
    """Seed 002's FeedForward(embed_size, linear_out_size): Linear, ReLU, Linear."""

    def __init__(self, embed_size: int, linear_out_size: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(embed_size, linear_out_size)
        self.linear2 = nn.Linear(linear_out_size, embed_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(torch.relu(self.linear1(x)))


class Residual(nn.Module):
    """A sub-layer's residual connection with its LayerNorm, before ("pre") or after ("post") it."""

    def __init__(self, size: int, norm: str, dropout: float) -> None:
        super().__init__()
        self.norm, self.pre, self.dropout = nn.LayerNorm(size), norm == "pre", nn.Dropout(dropout)

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        """What the sub-layer reads."""
        return self.norm(x) if self.pre else x

    def add(self, x: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input and the sub-layer's."""
        out = x + self.dropout(sub)
        return out if self.pre else self.norm(out)


class Encoder(nn.Module):
    """Seed 002's Encoder(input_embed_size, heads, linear_out_size): self-attention then feed-forward, each with its
    residual and norm."""

    def __init__(self, input_embed_size: int, heads: int, linear_out_size: int, dropout: float = 0.0,
                 norm: str = "pre") -> None:
        super().__init__()
        self.attention = MultiHeadAttention(heads, input_embed_size, dropout)
        self.ffn = FeedForward(input_embed_size, linear_out_size)
        self.res1, self.res2 = (Residual(input_embed_size, norm, dropout) for _ in range(2))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (N, L, E), mask (N, 1, 1, L) -> (N, L, E)."""
        inner = self.res1.inner(x)
        x = self.res1.add(x, self.attention(inner, *self.attention.project(inner), mask)[0])
        return self.res2.add(x, self.ffn(self.res2.inner(x)))


class Decoder(nn.Module):
    """A decoder layer: causal self-attention, cross-attention over the memory, feed-forward."""

    def __init__(self, input_embed_size: int, heads: int, linear_out_size: int, dropout: float = 0.0,
                 norm: str = "pre") -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(heads, input_embed_size, dropout)
        self.cross_attention = MultiHeadAttention(heads, input_embed_size, dropout)
        self.ffn = FeedForward(input_embed_size, linear_out_size)
        self.res1, self.res2, self.res3 = (Residual(input_embed_size, norm, dropout) for _ in range(3))

    def forward(self, x: torch.Tensor, self_kv: tuple[torch.Tensor, torch.Tensor] | None,
                cross_kv: tuple[torch.Tensor, torch.Tensor], self_mask: torch.Tensor | None,
                source_mask: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, ...]:
        """x (N, Lq, E); self_kv: cached keys/values (N, h, t, d) to extend (None: the whole sequence is x);
        cross_kv (N, h, Ls, d) -> output (N, Lq, E), this layer's self keys, values (N, h, t + Lq, d), and the
        cross-attention weights (N, h, Lq, Ls) | None."""
        inner = self.res1.inner(x)
        keys, values = self.self_attention.project(inner)  # (N, h, Lq, d)
        if self_kv is not None:
            keys, values = torch.cat([self_kv[0], keys], dim=2), torch.cat([self_kv[1], values], dim=2)
        x = self.res1.add(x, self.self_attention(inner, keys, values, self_mask)[0])
        context, weights = self.cross_attention(self.res2.inner(x), *cross_kv, source_mask, need_weights)
        x = self.res2.add(x, context)
        return self.res3.add(x, self.ffn(self.res3.inner(x))), keys, values, weights


class PositionalEncoding(nn.Module):
    """positions (...) int64 -> (..., E): the fixed sinusoids of Vaswani et al., or a learned table."""

    def __init__(self, max_positions: int, size: int, kind: str) -> None:
        super().__init__()
        self.learned = nn.Embedding(max_positions, size) if kind == "learned" else None
        if self.learned is None:
            position = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
            rate = torch.exp(torch.arange(0, size, 2, dtype=torch.float32) * (-math.log(10000.0) / size))  # (E/2,)
            table = torch.zeros(max_positions, size)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate[: size // 2])
            self.register_buffer("table", table, persistent=False)  # rebuilt from the spec, not saved

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if self.learned is not None:
            return self.learned(positions)
        return self.table[positions]


class TransformerSeq2Seq(TokenModel):
    """Encoder and decoder stacks; `forward` decodes the whole target at once under the causal mask, `step` decodes
    one token against the cache. Both compute the same log-probs."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if not spec.is_transformer:
            raise ValueError(f"TransformerSeq2Seq needs a spec with arch 'transformer', got {spec.arch!r}")
        self.spec = spec
        e, layer = spec.d_model, (spec.d_model, spec.n_heads, spec.d_ff, spec.dropout, spec.norm)
        self.source_embedding = nn.Embedding(spec.source_vocab_size, e, padding_idx=PAD_ID)
        self.target_embedding = nn.Embedding(spec.target_vocab_size, e, padding_idx=PAD_ID)
        self.positions = PositionalEncoding(spec.max_positions, e, spec.positional)
        self.dropout = nn.Dropout(spec.dropout)
        self.encoder_layers = nn.ModuleList(Encoder(*layer) for _ in range(spec.layers))
        self.decoder_layers = nn.ModuleList(Decoder(*layer) for _ in range(spec.layers))
        pre = spec.norm == "pre"  # pre-norm stacks end in a LayerNorm; post-norm layers end in one already
        self.encoder_norm = nn.LayerNorm(e) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(e) if pre else nn.Identity()
        self.output = None if spec.tie_embeddings else nn.Linear(e, spec.target_vocab_size)
        self.register_buffer("never_output", never_output(spec.target_vocab_size), persistent=False)

    def encode(self, source: torch.Tensor, lengths: torch.Tensor) -> TensorState:
        """source (N, L) right-padded, lengths (N,) -> memory, every layer's cross keys/values, source_mask, and
        the first step's state: positions 0 and an empty cache."""
        index = torch.arange(source.shape[1], device=source.device)  # (L,)
        mask = index[None, :] < lengths[:, None]  # (N, L)
        x = self.dropout(self.source_embedding(source) + self.positions(index))  # (N, L, E)
        for layer in self.encoder_layers:
            x = layer(x, mask[:, None, None, :])
        memory = self.encoder_norm(x)  # (N, L, E)
        cross = [layer.cross_attention.project(memory) for layer in self.decoder_layers]
        cross_keys = torch.stack([k for k, _ in cross])  # (layers, N, h, L, d)
        cross_values = torch.stack([v for _, v in cross])
        empty = cross_keys[:, :, :, :0]  # (layers, N, h, 0, d)
        return {"memory": memory, "cross_keys": cross_keys, "cross_values": cross_values, "source_mask": mask,
                "positions": torch.zeros_like(lengths), "past_keys": empty, "past_values": empty}

    def _decode(self, x: torch.Tensor, state: TensorState, cached: bool,
                self_mask: torch.Tensor | None) -> tuple[torch.Tensor, list, list, torch.Tensor | None]:
        """Run the decoder stack -> log-probs (N, Lq, V), each layer's self keys and values, last cross weights."""
        keys, values, weights = [], [], None
        source_mask = state["source_mask"][:, None, None, :]  # (N, 1, 1, Ls)
        last = len(self.decoder_layers) - 1
        for i, layer in enumerate(self.decoder_layers):
            past = (state["past_keys"][i], state["past_values"][i]) if cached else None
            x, k, v, weights = layer(x, past, (state["cross_keys"][i], state["cross_values"][i]), self_mask,
                                     source_mask, need_weights=i == last and cached)
            keys.append(k)
            values.append(v)
        x = self.decoder_norm(x)
        logits = x @ self.target_embedding.weight.T if self.output is None else self.output(x)  # (N, Lq, V)
        return F.log_softmax(logits + self.never_output, dim=-1), keys, values, weights

    def step(self, previous: torch.Tensor,
             state: TensorState) -> tuple[torch.Tensor, TensorState, torch.Tensor | None]:
        """previous (N,) ids at `positions` (N,), the cache (layers, N, h, t, d) x2 -> log_probs (N, V), the state
        with the cache grown to t + 1 and positions + 1, alphas (N, Ls): last layer's cross-attention, head mean."""
        x = self.dropout(self.target_embedding(previous) + self.positions(state["positions"]))[:, None]  # (N, 1, E)
        log_probs, keys, values, weights = self._decode(x, state, cached=True, self_mask=None)
        grown = {"past_keys": torch.stack(keys), "past_values": torch.stack(values),  # (layers, N, h, t + 1, d)
                 "positions": state["positions"] + 1}
        return log_probs[:, 0], {**state, **grown}, weights[:, :, 0].mean(dim=1)  # (N, V), ..., (N, Ls)

    def forward(self, source: torch.Tensor, lengths: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: target_in (N, T) starts with BOS -> log_probs (N, T, V), all positions at once."""
        return self.decode_sequence(self.encode(source, lengths), target_in)

    def decode_sequence(self, state: TensorState, target_in: torch.Tensor) -> torch.Tensor:
        """The full-sequence decoder over encoder `state`: target_in (N, T) -> log_probs (N, T, V)."""
        length = target_in.shape[1]
        index = torch.arange(length, device=target_in.device)  # (T,)
        x = self.dropout(self.target_embedding(target_in) + self.positions(index))  # (N, T, E)
        causal = index[None, :] <= index[:, None]  # (T, T): position t sees 0..t
        return self._decode(x, state, cached=False, self_mask=causal)[0]
