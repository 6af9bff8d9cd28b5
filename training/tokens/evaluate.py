"""Held-out accuracy of a token model in PyTorch: greedy (after every epoch, and on every rank's share under
torchrun) and beam search (the final report), each as exact-sequence and token accuracy."""
from __future__ import annotations

import torch

from runtime.contract import state_batch_axes
from runtime.evaluate import matches
from runtime.search import beam_search
from runtime.specials import UNK
from runtime.vocab import BOS, EOS, Vocabulary
from training.distributed import Dist

from .base import TokenModel, torch_steps
from .batches import TokenBatcher
from .data import MAX_LEN_MARGIN
from .pairs import TextPairs

EVAL_CHUNK = 1024  # validation rows per greedy decode; bounds memory only


@torch.no_grad()
def evaluate_tokens(model: TokenModel, pairs: TextPairs, source_vocab: Vocabulary, target_vocab: Vocabulary,
                    dist: Dist | None = None) -> tuple[float, float]:
    """Greedy decoding (eval mode) -> (exact-sequence accuracy, token accuracy). A sequence is exact when every token
    and the EOS after them match; token accuracy compares position by position over target + EOS. Under `dist` each
    rank decodes its share of the rows and the counts are summed."""
    model.eval()
    data = TokenBatcher(pairs, source_vocab, target_vocab, model.spec.reverse_source)
    rows = range(len(data)) if dist is None else dist.rows(len(data))
    exact, correct, total = _accuracy_counts(model, data, torch.tensor(rows, dtype=torch.long))
    if dist is not None:
        exact, correct, total = dist.all_sum(exact, correct, total)
    return exact / len(data), correct / total


def _accuracy_counts(model: TokenModel, data: TokenBatcher, rows: torch.Tensor) -> tuple[int, int, int]:
    """(exact sequences, correct tokens, reference tokens) of greedy decoding over `rows` of `data`."""
    max_len = int(data.target_lengths.max()) + MAX_LEN_MARGIN  # target_lengths count BOS, i.e. tokens + EOS
    exact = correct = total = 0
    for index in rows.split(EVAL_CHUNK):
        batch = data.batch(index)
        decoded = model.greedy(batch.source, batch.lengths, max_len)
        for row, out in zip(batch.target_out.tolist(), decoded):
            reference = row[:row.index(EOS) + 1]
            predicted = out + [EOS] if len(out) < max_len else out  # shorter than max_len: greedy stopped at EOS
            same, right = matches(predicted, reference, UNK)
            exact += same
            correct += right
            total += len(reference)
    return exact, correct, total


@torch.no_grad()
def evaluate_beam(model: TokenModel, pairs: TextPairs, source_vocab: Vocabulary, target_vocab: Vocabulary,
                  beam_size: int = 5, length_penalty: float = 1.0) -> float:
    """Exact-sequence accuracy of PyTorch beam search (`runtime.search.beam_search` over `torch_steps`, the best
    hypothesis; length_penalty as `translate_batch`'s default), with greedy's length limit."""
    model.eval()
    data = TokenBatcher(pairs, source_vocab, target_vocab, model.spec.reverse_source)
    max_len = int(data.target_lengths.max()) + MAX_LEN_MARGIN
    axes = state_batch_axes(model.spec)
    exact = 0
    for index in torch.arange(len(data)).split(EVAL_CHUNK):
        batch = data.batch(index)
        state, step = torch_steps(model, batch.source.numpy(), batch.lengths.numpy())
        found = beam_search(step, state, axes, batch_size=len(index), bos_id=BOS, eos_id=EOS,
                            max_decoding_length=max_len, beam_size=beam_size, length_penalty=length_penalty)
        for row, hyps in zip(batch.target_out.tolist(), found):
            exact += matches(hyps[0].tokens, row[:row.index(EOS)], UNK)[0]  # a reference ends by EOS (< max_len)
    return exact / len(data)
