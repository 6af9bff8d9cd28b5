"""Stateless encode and greedy decode in PyTorch: the reference the ONNX graphs must match.

Unlike the book's `EncoderDecoder.forward`, these honour a source mask: the decoder starts
from the last *valid* position, so right-padding a source changes nothing.
"""
from __future__ import annotations

import torch

from .models import DecoderAttn, EncoderDecoder


def last_valid_index(source_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True position per row of a (N, 1, L) mask -> (N,); 0 for empty rows."""
    # argmax returns the first maximum, and a cumulative sum peaks first at the last valid point.
    return source_mask.squeeze(1).to(torch.int64).cumsum(dim=-1).argmax(dim=-1)


def pick(seq: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather seq[n, index[n]] for each n: (N, L, D), (N,) -> (N, 1, D)."""
    idx = index.view(-1, 1, 1).expand(-1, 1, seq.shape[-1])  # (N, 1, D)
    return seq.gather(1, idx)


def encode(model: EncoderDecoder, source: torch.Tensor, source_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run the encoder once -> the decoder's first input, hidden state and attention states."""
    hidden_seq = model.encoder(source)  # (N, L, H)
    last = last_valid_index(source_mask)  # (N,)
    states = {
        "hidden": pick(hidden_seq, last).permute(1, 0, 2),  # (1, N, H)
        "decoder_input": pick(source, last),  # (N, 1, F)
    }
    if isinstance(model.decoder, DecoderAttn):
        proj_keys, states["values"] = model.decoder.attn.project_keys(hidden_seq)
        states["keys_t"] = proj_keys.transpose(-1, -2)  # (N, [heads,] H, L): steps never transpose
    return states


def full_mask(source: torch.Tensor) -> torch.Tensor:
    """All-valid mask (N, 1, L) for a source (N, L, F)."""
    return torch.ones(source.shape[0], 1, source.shape[1], dtype=torch.bool, device=source.device)


def decode_step(
    model: EncoderDecoder, states: dict[str, torch.Tensor], x: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One decoder step -> next point (N, 1, F), hidden (1, N, H), alphas or None."""
    if isinstance(model.decoder, DecoderAttn):
        return model.decoder.step(x, hidden, states["keys_t"], states["values"], mask)
    return (*model.decoder.step(x, hidden), None)


@torch.no_grad()
def reference_decode(
    model: EncoderDecoder, source: torch.Tensor, target_len: int, source_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy decode -> outputs (N, Lt, F) and alphas (N, Lt, Ls) / (N, heads, Lt, Ls) or None."""
    mask = full_mask(source) if source_mask is None else source_mask.to(torch.bool)
    states = encode(model, source, mask)
    x, hidden = states["decoder_input"], states["hidden"]
    outputs, alphas = [], []
    for _ in range(target_len):
        x, hidden, a = decode_step(model, states, x, hidden, mask)
        outputs.append(x)
        if a is not None:
            alphas.append(a)
    if not alphas:
        return torch.cat(outputs, dim=1), None
    return torch.cat(outputs, dim=1), torch.cat(alphas, dim=-2)  # (N, Lt, F), (N, [heads,] Lt, Ls)
