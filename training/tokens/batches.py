"""Token pairs as tensors: sources and targets encoded once, then padded batches of row indices, optionally bucketed
by source length. Encoding rules: see `training.tokens.trainer`."""
from __future__ import annotations

from typing import NamedTuple

import torch

from runtime.vocab import BOS, EOS, PAD, Vocabulary

from .pairs import TextPairs

BUCKET_BATCHES = 50  # a bucket sorts this many batches' worth of shuffled pairs by source length


def encode_sources(texts: tuple[str, ...], vocab: Vocabulary, reverse: bool = False) -> list[list[int]]:
    """Source ids: tokens then EOS; `reverse` reverses the tokens only (EOS stays last), as the runtime does."""
    ids, lengths = vocab.encode_batch(list(texts), add_eos=True, reverse=reverse)
    return [row[:n].tolist() for row, n in zip(ids, lengths)]


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (N, L) int64 and lengths (N,) int64."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)  # (N,)
    ids = torch.full((len(rows), int(lengths.max())), PAD, dtype=torch.long)  # (N, L)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, lengths


class TokenBatch(NamedTuple):
    """One padded batch: source (N, Ls), lengths (N,), target_in and target_out (N, Lt)."""

    source: torch.Tensor
    lengths: torch.Tensor
    target_in: torch.Tensor
    target_out: torch.Tensor


class TokenBatcher:
    """Pairs encoded once; batches are index tensors, padded to their own longest row on `batch(index)`."""

    def __init__(self, pairs: TextPairs, source_vocab: Vocabulary, target_vocab: Vocabulary,
                 reverse_source: bool = False) -> None:
        self.source, self.lengths = _padded(encode_sources(pairs.sources, source_vocab, reverse_source))  # (N, Ls)
        targets = [target_vocab.encode(t, add_eos=False) for t in pairs.targets]
        self.target_in, self.target_lengths = _padded([[BOS] + t for t in targets])  # (N, Lt)
        self.target_out, _ = _padded([t + [EOS] for t in targets])  # (N, Lt)

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, index: torch.Tensor) -> TokenBatch:
        """The rows at `index`, cut to the longest source and target among them."""
        ls, lt = int(self.lengths[index].max()), int(self.target_lengths[index].max())
        return TokenBatch(self.source[index, :ls], self.lengths[index], self.target_in[index, :lt],
                          self.target_out[index, :lt])

    def epoch_batches(self, batch_size: int, generator: torch.Generator, bucket: bool,
                      order: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Shuffled batches of row indices; `bucket` sorts chunks of BUCKET_BATCHES batches by source length
        (stable, so ties keep the shuffle) and then shuffles the batch order, all drawn from `generator`. A given
        `order` (a rank's shard, already shuffled) replaces the shuffle of the rows."""
        if order is None:
            order = torch.randperm(len(self), generator=generator)  # (N,)
        batch_size = min(batch_size, max(len(order), 1))  # a batch past the data is all of it (torch's split
        if not bucket:  # takes an int64: --batch-size 1e21 overflowed there, a traceback)
            return list(order.split(batch_size))
        batches: list[torch.Tensor] = []
        for chunk in order.split(min(batch_size * BUCKET_BATCHES, max(len(order), 1))):
            by_length = torch.sort(self.lengths[chunk], stable=True).indices
            batches.extend(chunk[by_length].split(batch_size))
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
