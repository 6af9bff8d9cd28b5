"""`Seq2Seq.translate_batch` over a token model's graphs (`runtime.token_steps.TokenSteps`): texts in, n-best
translations out (greedy, beam or sampling), and the vocabularies and text checks around it (the options'
checks: `runtime.decode_options`).

`translate`'s options follow CTranslate2's `translate_batch`: `beam_size` (1 = greedy), `num_hypotheses`,
`length_penalty` (score = sum of log-probs / length ** length_penalty, length counting the eos),
`max_decoding_length`, `min_decoding_length`, `sampling_topk` (1 = no sampling, 0 = the whole distribution),
`sampling_topp`, `sampling_temperature`, `seed`, `return_attention`. Sampling needs `beam_size` 1.

A transformer has a position table of `spec.max_positions` rows: source token i reads row i and output token t
row t, so longer sources and a larger `max_decoding_length` are refused rather than read past the table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .contract import VOCAB_FILES
from .declared import TokenContract
from .decode_options import samples, translate_options
from .denormals import flushing
from .errors import InputError, IntegrityError, brief
from .manifest import Manifest
from .model_files import check_sha256, read_regular_file
from .points import BEFORE, Cancel, check_cancel, stoppable
from .search import beam_search, greedy_search, sample
from .spec import ModelSpec
from .token_steps import TokenSteps, contract_for
from .vocab import VocabError, Vocabulary
from .workers import Workers

MAX_VOCAB_BYTES = 64 << 20
FINISH_REASONS = ("eos", "length")  # Translation.finish_reason: ended by end-of-sequence, or cut at the length bound


@dataclass(frozen=True)
class Translation:
    """One hypothesis: its text, target tokens and ids (no bos/eos), score, summed log-prob, attention (len, Ls).

    attention row t is output token t's weights over this text's own source positions (its tokens and the bos/eos
    the model reads; a fixed-length model's whole width, padding included), whatever else was in the call: the
    decoder's attention (multi-head: averaged over heads), or a transformer's last decoder layer's cross-attention
    averaged over heads.

    finish_reason is "eos" where the hypothesis ended with end-of-sequence (not output), "length" where the decode
    reached max_decoding_length first: the text was cut, not ended by the model."""

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None = None
    finish_reason: str = field(kw_only=True)


def load_vocabularies(model_dir: Path, manifest: Manifest) -> dict[str, Vocabulary]:
    """Each side's vocabulary, read within bounds and checked against the manifest's sha256."""
    out = {}
    for side, entry in manifest.vocabularies.items():
        path = model_dir / VOCAB_FILES[side]
        data = read_regular_file(path, MAX_VOCAB_BYTES, IntegrityError, "vocabulary listed in the manifest is "
                                 "missing; re-export the model")
        check_sha256(path, data, entry["sha256"], IntegrityError)
        try:
            out[side] = Vocabulary.from_dict(json.loads(data.decode("utf-8")))
        except (ValueError, VocabError, RecursionError) as exc:
            raise IntegrityError(f"{path}: not a seq2onnx vocabulary ({exc}); re-export the model") from None
        out[side].check_usable()  # a subword vocabulary without `tokenizers` fails here, at load, not per request
        size = getattr(manifest.spec, f"{side}_vocab_size", 0)
        if size and len(out[side]) != size:  # ids the graphs' tables do not have, or tokens they never give
            raise IntegrityError(f"{path}: holds {len(out[side])} tokens, but the manifest's spec says "
                                 f"{side}_vocab_size {size}; the file was altered, re-export the model")
    return out


def check_texts(texts: Any) -> list[str]:
    """A list of non-empty strings of Unicode characters (no lone surrogates)."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        fix = "wrap one text as [text]" if isinstance(texts, str) else "pass them as a list, e.g. list(texts)"
        raise InputError(f"texts: expected a list of strings, got {brief(texts)}; {fix}")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"texts[{i}]: expected a non-empty string, got {brief(text)}")
        offset = undecoded(text)
        if offset is not None:
            raise InputError(f"texts[{i}]: expected Unicode text, got a lone surrogate U+{ord(text[offset]):04X} at "
                             f"character {offset} (half of a UTF-16 pair, or a byte that was not UTF-8); pass "
                             "UTF-8 decoded text")
    return list(texts)


def undecoded(text: str) -> int | None:
    """The offset of text's first lone surrogate (U+D800-U+DFFF: no character; what Python makes of a byte that was
    not UTF-8 in argv or a file read with surrogateescape, or JSON's unpaired \\ud800 escapes), else None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def source_token_limit(spec: ModelSpec, contract: TokenContract | None = None) -> int:
    """The most source tokens (its specials included) a model reads: MAX_SOURCE_TOKENS, a transformer's
    max_positions, or a declared model's own bound."""
    return contract_for(spec, contract).sources.max_len


def too_long(n: int, spec: ModelSpec, contract: TokenContract | None = None) -> str:
    """Why `n` source tokens (specials included) are refused: the limit, and where it comes from."""
    limit = source_token_limit(spec, contract)
    if spec.is_declared:
        fixed = contract_for(spec, contract).sources.fixed_len is not None
        return (f"{n} tokens with its specials, more than the {limit} this model reads"
                f"{' (it was trained on sources of exactly that length)' if fixed else ''}")
    if spec.is_transformer and limit == spec.max_positions:
        return (f"{n} tokens with the closing </s>, more than this transformer's max_positions {limit} (source "
                "token i reads row i of its position table)")
    return (f"{n} tokens with the closing </s>, more than the {limit} the runtime reads of one source (its "
            "attention's memory grows with the length)")


def _first_unencodable(texts: list[str], vocab: Vocabulary) -> int:
    for i, text in enumerate(texts):
        try:
            vocab.encode(text)
        except VocabError:
            return i
    raise AssertionError("encode_batch refused texts that encode one by one")


def encode_sources(texts: list[str], vocab: Vocabulary, spec: ModelSpec,
                   contract: TokenContract | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (N, L) and lengths (N,) as the model was trained on them (its tokens, reversed where it
    was trained so, between the bos and eos it reads; padded to its fixed length if it has one), refusing over-long
    inputs by index."""
    rules = contract_for(spec, contract).sources
    try:
        ids, lengths = vocab.encode_batch(texts, add_bos=rules.add_bos, add_eos=rules.add_eos, reverse=rules.reverse,
                                          width=rules.fixed_len or 0)  # (N, fixed_len) where fixed: what it reads
    except VocabError as exc:  # a token a vocabulary without unk lacks: a bad text, named by its index
        raise InputError(f"texts[{_first_unencodable(texts, vocab)}]: {exc}") from None
    if ids.shape[1] > rules.max_len:  # a row may be over: name the first that is
        for i, n in enumerate(lengths.tolist()):
            if n > rules.max_len:
                raise InputError(f"texts[{i}]: {too_long(n, spec, contract)}; split the text")
    return ids, lengths


def translate(steps: TokenSteps, vocabularies: dict[str, Vocabulary], texts: Any, beam_size: int = 1,
              num_hypotheses: int = 1, length_penalty: float = 1.0, max_decoding_length: int | None = None,
              min_decoding_length: int = 0, sampling_topk: int = 1,
              sampling_topp: float = 1.0, sampling_temperature: float = 1.0, seed: int | None = None,
              return_attention: bool = False, cancel: Cancel | None = None,
              workers: Workers[TokenSteps] | None = None) -> list[list[Translation]]:
    """Encode the texts once, decode with the chosen strategy, and turn ids back into text. `cancel` is asked
    before the encoder and before every decoder step (a one-call graph, the greedy loop or the beam graph: before
    it), and watched while the encoder or a one-call graph runs:
    True stops with Cancelled. `workers`: copies of `steps` (steps first) that decode chunks of a call of many
    rows at once (runtime.workers); a seeded sampling call runs whole, its draws being the batch's."""
    texts = check_texts(texts)
    max_decoding_length, length_penalty, sampling_topk, sampling_topp, sampling_temperature = translate_options(
        steps, beam_size, num_hypotheses, length_penalty, max_decoding_length, min_decoding_length, sampling_topk,
        sampling_topp, sampling_temperature, seed, return_attention)  # every option checked, even for no texts
    check_cancel(cancel, len(texts))
    sampling = samples(sampling_topk)
    fast = steps.fast is not None and not return_attention  # the fast graphs carry no attention weights
    own, steps = steps, steps.fast if fast else steps
    if not texts:
        return []
    ids, lengths = encode_sources(texts, vocabularies["source"], steps.spec, steps.contract)
    specials = steps.contract.specials
    common = dict(bos_id=specials.bos, eos_id=specials.eos, min_decoding_length=min_decoding_length,
                  max_decoding_length=max_decoding_length, return_attention=return_attention,
                  constant=steps.constant)
    search = dict(beam_size=beam_size, num_hypotheses=num_hypotheses, length_penalty=length_penalty)
    sampler = dict(seed=seed, sampling_temperature=sampling_temperature, sampling_topk=sampling_topk,
                   sampling_topp=sampling_topp, never=steps.contract.never) if sampling else None

    def decode(copy: TokenSteps, rows: slice) -> list[list[Any]]:
        n = rows.stop - rows.start
        with flushing(n * beam_size > 1):  # one row has no masked attention to flush (runtime.denormals)
            return _decode(copy.fast if fast else copy, ids[rows], lengths[rows], search, sampler,
                           {**common, "batch_size": n}, cancel)

    if workers is None:
        found = decode(own, slice(0, len(texts)))
    else:  # seeded draws are the whole batch's: such a call runs whole
        width = ids.shape[1]
        parts = ([slice(0, len(texts))] if sampler is not None and seed is not None else
                 workers.chunks(len(texts), beam_size, lambda n: _graph(steps, n, width, search, sampler)))
        found = [hyps for part in workers.run(parts, decode) for hyps in part]
    never = steps.contract.never
    # seq2onnx's own step graphs put <pad> and <s> at NEVER_LOGIT (-1e4), not -inf (parity stays finite): a beam
    # with more slots than real candidates fills them with such tokens, every one ranked below every real
    # hypothesis. They are no outputs: dropped, as the search drops -inf candidates (the n-best may be shorter).
    dropped = frozenset(never) if never and (beam_size != 1 or num_hypotheses != 1) else None
    text = vocabularies["target"].hypothesis_text
    widths = own_widths(ids, lengths, steps) if return_attention else None
    out = []  # loops, not comprehensions: fewer frames around a batch-1 call (see Vocabulary.encode_batch)
    for i, hypotheses in enumerate(found):
        row = []
        for h in hypotheses:
            if dropped is None or dropped.isdisjoint(h.tokens):
                attention = h.attention if widths is None or h.attention is None else h.attention[..., :widths[i]]
                # a decode runs max_decoding_length steps, eos taking one: an output that long never met eos
                row.append(Translation(*text(h.tokens), list(h.tokens), h.score, h.log_prob, attention,
                                       finish_reason=FINISH_REASONS[len(h.tokens) >= max_decoding_length]))
        out.append(row)
    return out


def own_widths(ids: np.ndarray, lengths: np.ndarray, steps: TokenSteps) -> list[int]:
    """Each text's own attention width: the positions the model read for it alone (its tokens and the bos/eos it
    reads), not the padded batch's; a fixed-length model reads (and attends to) its whole fixed width."""
    if contract_for(steps.spec, steps.contract).sources.fixed_len:
        return [ids.shape[1]] * len(ids)
    return lengths.tolist()


def _graph(steps: TokenSteps, inputs: int, width: int, search: dict[str, Any], sampler: dict[str, Any] | None) -> int:
    """Which graph `_decode` runs for `inputs` sources of `width` tokens (an id): a chunk of a split call must run
    the whole call's (the wide and fast graphs' float32 sums differ)."""
    beam_size, beam = search["beam_size"], search["beam_size"] != 1 or search["num_hypotheses"] != 1
    graph = steps.beam_graph(inputs, width, beam_size) if beam else None
    if graph is not None:
        return id(graph)
    if beam and steps.has_beam_step:
        return 0  # a recurrent model's beam step: one graph for every size
    if not beam and sampler is None and steps.greedy is not None:
        return id(steps.greedy_loop(inputs, width))
    return id(steps.step_graph(inputs * beam_size))


def _decode(steps: TokenSteps, ids: np.ndarray, lengths: np.ndarray, search: dict[str, Any],
            sampler: dict[str, Any] | None, common: dict[str, Any], cancel: Cancel | None) -> list[list[Any]]:
    """The n-best hypotheses per source: the beam graph, the beam step or step loop, sampling, or greedy."""
    step = steps.step if cancel is None else stoppable(steps.step, cancel)
    encode = steps.encode if cancel is None else stoppable(steps.encode, cancel, BEFORE)  # asked, then watched
    beam_size, num_hypotheses = search["beam_size"], search["num_hypotheses"]
    beam = steps.beam_graph(*ids.shape, beam_size)  # a transformer's beam search graph, or None
    if (beam_size != 1 or num_hypotheses != 1) and beam is not None:  # one call: the export's beam graph
        run = beam.hypotheses if cancel is None else stoppable(beam.hypotheses, cancel, BEFORE)  # then watched
        return run(ids, lengths, beam_size, num_hypotheses, search["length_penalty"],
                   common["max_decoding_length"], common["min_decoding_length"], cancel)
    if beam_size != 1 or num_hypotheses != 1:  # with a beam step, what attention reads stays once per input
        fold = steps.has_beam_step
        step = steps.beam_step if fold else steps.step
        between = None if cancel is None else stoppable(_nothing, cancel, "before its first step")
        step = step if cancel is None else stoppable(step, cancel)
        return beam_search(step, encode(ids, lengths, cancel), steps.batch_axes, per_input=fold, between=between,
                           **search, **common)
    if sampler is not None:
        return [[h] for h in sample(step, encode(ids, lengths, cancel), steps.batch_axes, **sampler, **common)]
    if steps.greedy is not None:  # one call (two where the encoder is its own graph): the greedy loop graph
        tokens = steps.greedy_tokens if cancel is None else stoppable(steps.greedy_tokens, cancel, BEFORE)
        return [[h] for h in tokens(ids, lengths, common["max_decoding_length"], common["min_decoding_length"],
                                    common["return_attention"], cancel)]
    return [[h] for h in greedy_search(step, encode(ids, lengths, cancel), steps.batch_axes, **common)]


def _nothing() -> None:
    """What `stoppable` wraps where only its ask is wanted."""
