"""The book's encoder-decoder models (GRU, dot-product and multi-head attention).

Parameters are created in the reference's order so that seeded construction reproduces
it exactly and its state_dicts load here. Each stateful book method sits on a stateless
core (`step`, `attend`, `project_keys`) that the export wrappers and reference decode reuse.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK_FILL = -1e9


class Encoder(nn.Module):
    """GRU encoder; `forward(x)` returns every hidden state (N, L, H)."""

    def __init__(self, n_features: int, hidden_dim: int) -> None:
        super().__init__()
        self.n_features = n_features
        self.hidden_dim = hidden_dim
        self.hidden: torch.Tensor | None = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Encode (N, L, F) into hidden states (N, L, H)."""
        rnn_out, self.hidden = self.basic_rnn(x)  # (N, L, H), (1, N, H)
        return rnn_out


class Decoder(nn.Module):
    """GRU decoder with a linear read-out, one point per call."""

    def __init__(self, n_features: int, hidden_dim: int) -> None:
        super().__init__()
        self.n_features = n_features
        self.hidden_dim = hidden_dim
        self.hidden: torch.Tensor | None = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)
        self.regression = nn.Linear(self.hidden_dim, self.n_features)

    def init_hidden(self, hidden_seq: torch.Tensor) -> None:
        """Start from the encoder's final hidden state, made sequence-first."""
        self.hidden = hidden_seq[:, -1:].permute(1, 0, 2)  # (1, N, H)

    def step(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stateless step: (N, 1, F), (1, N, H) -> next point (N, 1, F), next hidden (1, N, H)."""
        rnn_out, hidden = self.basic_rnn(x, hidden)  # (N, 1, H), (1, N, H)
        out = self.regression(rnn_out[:, -1:])  # (N, 1, F)
        return out.view(-1, 1, self.n_features), hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predict the next point (N, 1, F), updating the stored hidden state."""
        out, self.hidden = self.step(x, self.hidden)
        return out


class Attention(nn.Module):
    """Scaled dot-product attention with learned query/key(/value) projections."""

    def __init__(self, hidden_dim: int, input_dim: int | None = None, proj_values: bool = False) -> None:
        super().__init__()
        self.d_k = hidden_dim
        self.input_dim = hidden_dim if input_dim is None else input_dim
        self.proj_values = proj_values
        self.linear_query = nn.Linear(self.input_dim, hidden_dim)
        self.linear_key = nn.Linear(self.input_dim, hidden_dim)
        self.linear_value = nn.Linear(self.input_dim, hidden_dim)
        self.alphas: torch.Tensor | None = None

    def project_keys(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project keys (N, L, D) once: -> proj_keys (N, L, H), values (N, L, H or D)."""
        values = self.linear_value(keys) if self.proj_values else keys
        return self.linear_key(keys), values

    def init_keys(self, keys: torch.Tensor) -> None:
        """Store keys and their projections for the following queries."""
        self.keys = keys
        self.proj_keys, self.values = self.project_keys(keys)

    def scores(self, query: torch.Tensor, keys_t: torch.Tensor) -> torch.Tensor:
        """Scaled dot products against transposed projected keys: (N, 1, D) x (N, H, L) -> (N, 1, L)."""
        proj_query = self.linear_query(query)  # (N, 1, H)
        return torch.matmul(proj_query, keys_t) / math.sqrt(self.d_k)

    def score_function(self, query: torch.Tensor) -> torch.Tensor:
        """Book API: scores against the stored keys (N, 1, L)."""
        return self.scores(query, self.proj_keys.transpose(-1, -2))

    def attend(
        self, query: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stateless attention over keys_t (N, H, L) -> context (N, 1, H), alphas (N, 1, L); mask == 0 is ignored.

        keys_t is the projected keys already transposed, so a decoder step does no transpose."""
        return weigh(self.scores(query, keys_t), values, mask, self.d_k)

    def forward(self, query: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Book API: context vector (N, 1, H) for the stored keys; keeps `alphas`."""
        context, alphas = self.attend(query, self.proj_keys.transpose(-1, -2), self.values, mask)
        self.alphas = alphas.detach()
        return context


def weigh(scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, d_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax of scores (..., 1, L) and the weighted sum of values (..., L, H)."""
    if mask is not None:
        scores = scores.masked_fill(mask == 0, MASK_FILL)
    alphas = F.softmax(scores, dim=-1)  # (..., 1, L)
    return torch.matmul(alphas, values), alphas  # (..., 1, H)


class MultiHeadAttention(nn.Module):
    """Several `Attention` heads whose contexts are concatenated and projected back."""

    def __init__(self, n_heads: int, d_model: int, input_dim: int | None = None, proj_values: bool = True) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.linear_out = nn.Linear(n_heads * d_model, d_model)
        self.attn_heads = nn.ModuleList(
            [Attention(d_model, input_dim=input_dim, proj_values=proj_values) for _ in range(n_heads)]
        )

    def init_keys(self, key: torch.Tensor) -> None:
        """Give every head the same keys."""
        for attn in self.attn_heads:
            attn.init_keys(key)

    @property
    def alphas(self) -> torch.Tensor:
        """Per-head attention weights (n_heads, N, 1, L)."""
        return torch.stack([attn.alphas for attn in self.attn_heads], dim=0)

    def output_function(self, contexts: list[torch.Tensor]) -> torch.Tensor:
        """Concatenate head contexts (N, 1, heads*D) and project to (N, 1, D)."""
        return self.linear_out(torch.cat(contexts, dim=-1))

    def project_keys(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head projections stacked head-second: (N, heads, L, H) each."""
        pairs = [attn.project_keys(keys) for attn in self.attn_heads]
        return torch.stack([k for k, _ in pairs], dim=1), torch.stack([v for _, v in pairs], dim=1)

    def attend(
        self, query: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stateless, all heads in one batched product: keys_t (N, heads, H, L), values (N, heads, L, H)
        -> context (N, 1, D), alphas (N, heads, 1, L)."""
        n_heads, d_k = len(self.attn_heads), self.attn_heads[0].d_k
        proj_query = torch.stack([attn.linear_query(query) for attn in self.attn_heads], dim=1)  # (N, heads, 1, H)
        scores = torch.matmul(proj_query, keys_t) / math.sqrt(d_k)  # (N, heads, 1, L)
        head_mask = None if mask is None else mask.unsqueeze(1)  # (N, 1, 1, L)
        context, alphas = weigh(scores, values, head_mask, d_k)  # (N, heads, 1, H)
        concatenated = context.transpose(1, 2).reshape(-1, 1, n_heads * context.shape[-1])  # (N, 1, heads*H)
        return self.linear_out(concatenated), alphas

    def forward(self, query: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Book API: combined context (N, 1, D) over the stored keys."""
        return self.output_function([attn(query, mask=mask) for attn in self.attn_heads])


class DecoderAttn(nn.Module):
    """GRU decoder that attends over the encoder states; `n_heads` selects multi-head attention."""

    def __init__(self, n_features: int, hidden_dim: int, n_heads: int | None = None) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.n_features = n_features
        self.n_heads = n_heads
        self.hidden: torch.Tensor | None = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)
        if n_heads is None:
            self.attn: Attention | MultiHeadAttention = Attention(self.hidden_dim)
        else:
            self.attn = MultiHeadAttention(n_heads, self.hidden_dim)
        self.regression = nn.Linear(2 * self.hidden_dim, self.n_features)

    def init_hidden(self, hidden_seq: torch.Tensor) -> None:
        """Keys/values are the encoder states; the hidden state is the final one."""
        self.attn.init_keys(hidden_seq)
        self.hidden = hidden_seq[:, -1:].permute(1, 0, 2)  # (1, N, H)

    def readout(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Regress the next point (N, 1, F) from [context, query] (N, 1, 2H)."""
        out = self.regression(torch.cat([context, query], dim=-1))
        return out.view(-1, 1, self.n_features)

    def step(
        self,
        x: torch.Tensor,
        hidden: torch.Tensor,
        keys_t: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stateless step over transposed projected keys -> next point (N, 1, F), hidden (1, N, H), alphas."""
        rnn_out, hidden = self.basic_rnn(x, hidden)  # (N, 1, H)
        query = rnn_out[:, -1:]  # (N, 1, H)
        context, alphas = self.attn.attend(query, keys_t, values, mask)
        return self.readout(context, query), hidden, alphas

    def forward(self, X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Book API: next point (N, 1, F) from the stored hidden state and keys."""
        rnn_out, self.hidden = self.basic_rnn(X, self.hidden)
        query = rnn_out[:, -1:]  # (N, 1, H)
        return self.readout(self.attn(query, mask=mask), query)


class EncoderDecoder(nn.Module):
    """Training: full sequence in, teacher forcing with `teacher_forcing_prob`. Eval: source in, greedy."""

    def __init__(
        self, encoder: Encoder, decoder: nn.Module, input_len: int, target_len: int, teacher_forcing_prob: float = 0.5
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.input_len = input_len
        self.target_len = target_len
        self.teacher_forcing_prob = teacher_forcing_prob
        self.outputs: torch.Tensor | None = None

    def init_outputs(self, batch_size: int) -> None:
        """Allocate the (N, target_len, F) output buffer."""
        device = next(self.parameters()).device
        self.outputs = torch.zeros(batch_size, self.target_len, self.encoder.n_features, device=device)

    def store_output(self, i: int, out: torch.Tensor) -> None:
        """Keep step i's prediction."""
        self.outputs[:, i : i + 1, :] = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Decode `target_len` points after the first `input_len` points of x (N, L, F)."""
        source_seq = x[:, : self.input_len, :]  # (N, Ls, F)
        target_seq = x[:, self.input_len :, :]  # (N, Lt, F), empty in eval
        self.init_outputs(x.shape[0])
        self.decoder.init_hidden(self.encoder(source_seq))
        dec_inputs = source_seq[:, -1:, :]  # (N, 1, F)
        for i in range(self.target_len):
            out = self.decoder(dec_inputs)  # (N, 1, F)
            self.store_output(i, out)
            # Targets are unknown at inference, so teacher forcing only happens in training mode.
            if self.training and torch.rand(1).item() < self.teacher_forcing_prob:
                dec_inputs = target_seq[:, i : i + 1, :]
            else:
                dec_inputs = out
        return self.outputs


class EncoderDecoderAttn(EncoderDecoder):
    """`EncoderDecoder` that also keeps the attention weights of every step in `alphas`."""

    def __init__(
        self, encoder: Encoder, decoder: DecoderAttn, input_len: int, target_len: int, teacher_forcing_prob: float = 0.5
    ) -> None:
        super().__init__(encoder, decoder, input_len, target_len, teacher_forcing_prob)
        self.alphas: torch.Tensor | None = None

    def init_outputs(self, batch_size: int) -> None:
        """Also allocate alphas: (N, Lt, Ls), or (N, heads, Lt, Ls) for multi-head."""
        super().init_outputs(batch_size)
        heads = self.decoder.n_heads
        shape = (batch_size, self.target_len, self.input_len)
        if heads is not None:
            shape = (batch_size, heads, self.target_len, self.input_len)
        self.alphas = torch.zeros(*shape, device=self.outputs.device)

    def store_output(self, i: int, out: torch.Tensor) -> None:
        """Keep step i's prediction and attention weights."""
        super().store_output(i, out)
        alphas = self.decoder.attn.alphas  # (N, 1, Ls) or (heads, N, 1, Ls)
        if alphas.dim() == 4:
            self.alphas[:, :, i : i + 1, :] = alphas.transpose(0, 1)
        else:
            self.alphas[:, i : i + 1, :] = alphas
