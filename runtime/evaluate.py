"""Score an exported token model on text pairs (what `seq2onnx eval` prints), with the runtime alone.

Scoring follows the trainer's `evaluate_tokens`, so eval and training report the same figures:
  exact   a hypothesis is exact when its ids equal the reference's target ids (`vocab.encode(target,
          add_eos=False)`) and it stopped by emitting EOS: one cut off at the decoding limit is never exact.
  token   position by position over the reference's ids + EOS, against the hypothesis's ids + EOS (no EOS when it
          was cut off), divided by the number of reference ids + EOS.
A reference token outside the target vocabulary (encoded as <unk>) is never matched, so a model that writes <unk>
for it, or anything else, is not scored as right.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable

from .specials import UNK
from .vocab import EOS, VocabError

UNK_WARN_FRACTION = 0.10  # more unknown source tokens than this: the data is likely not the model's
# (total, description) -> a context whose value has .update(n) (a tqdm bar), or is None for no progress
Progress = Callable[[int, str], AbstractContextManager[Any]]


def no_progress(total: int, desc: str) -> AbstractContextManager[Any]:
    """Progress that shows nothing."""
    return nullcontext(None)


def readable_pairs(model: Any, pairs: Any) -> tuple[Any, int]:
    """The pairs the model's vocabularies can encode (None when none can), and how many were left out: a
    vocabulary without an unknown id (a declared model's may have none) cannot stand for a token it lacks."""
    vocabularies = model.vocabularies
    if all(v.ids.unk is not None for v in vocabularies.values()):
        return pairs, 0
    kept = [i for i, texts in enumerate(zip(pairs.sources, pairs.targets))
            if all(_encodable(vocabularies[side], text) for side, text in zip(("source", "target"), texts))]
    return (pairs.subset(kept) if kept else None), len(pairs.sources) - len(kept)


def short_enough(model: Any, pairs: Any) -> tuple[Any, int, str]:
    """The pairs whose sources the model reads (None when none does), how many were left out, and the limit said
    (a subword tokenizer's 1000-character line can hold more tokens than the runtime reads of one source)."""
    from .token_steps import contract_for  # token encoding rules: imported where used, as eval alone needs them
    from .tokens import source_token_limit, too_long

    rules = contract_for(model.spec, model.contract).sources
    vocab = model.vocabularies["source"]
    lengths = [len(vocab.encode(text, add_eos=rules.add_eos, add_bos=rules.add_bos)) for text in pairs.sources]
    limit = source_token_limit(model.spec, model.contract)
    kept = [i for i, n in enumerate(lengths) if n <= limit]
    if len(kept) == len(lengths):
        return pairs, 0, ""
    first = next(i for i, n in enumerate(lengths) if n > limit)
    return (pairs.subset(kept) if kept else None), len(lengths) - len(kept), too_long(lengths[first], model.spec,
                                                                                       model.contract)


def _encodable(vocab: Any, text: str) -> bool:
    try:
        vocab.encode(text, add_eos=False)
    except VocabError:
        return False
    return True


def unknown_fraction(vocab: Any, texts: tuple[str, ...]) -> float:
    """The share of the texts' tokens that `vocab` maps to its unknown id (0 for no tokens; a vocabulary without
    one refuses unknown tokens instead, naming the first)."""
    ids = [i for text in texts for i in vocab.encode(text, add_eos=False)]
    return sum(i == vocab.ids.unk for i in ids) / len(ids) if ids else 0.0


def decode(model: Any, sources: tuple[str, ...], batch_size: int, progress: Progress, desc: str,
           **options: Any) -> tuple[list[list[int]], float]:
    """The best hypothesis's ids per source, and the seconds spent in translate_batch."""
    model.translate_batch([sources[0]], **options)  # warm-up: onnxruntime's first run allocates
    found: list[list[int]] = []
    seconds = 0.0
    with progress(len(sources), desc) as bar:
        for start in range(0, len(sources), batch_size):
            texts = list(sources[start:start + batch_size])
            begin = time.perf_counter()
            translations = model.translate_batch(texts, **options)
            seconds += time.perf_counter() - begin
            found.extend(hyps[0].ids for hyps in translations)
            if bar is not None:
                bar.update(len(texts))
    return found, seconds


def matches(predicted: list[int], reference: list[int], unk: int | None) -> tuple[bool, int]:
    """(exact, correct tokens) of one hypothesis against its reference, both ending in EOS where they stopped: a
    reference token the vocabulary could not hold (`unk`, its unknown id) is never matched, not even by `unk`."""
    correct = sum(p == r and r != unk for p, r in zip(predicted, reference))
    return correct == len(reference) and len(predicted) == len(reference), correct


def score(found: list[list[int]], references: list[list[int]], max_len: int, eos: int = EOS,
          unk: int | None = UNK) -> dict[str, Any]:
    """Exact flags, exact and token accuracy of hypotheses against references (see the module docstring); `eos`
    and `unk`: the target vocabulary's end and unknown ids."""
    flags, correct, total = [], 0, 0
    for ids, ref in zip(found, references):
        predicted = ids + [eos] if len(ids) < max_len else ids  # shorter than the limit: it stopped at eos
        reference = ref + [eos]
        exact, right = matches(predicted, reference, unk)
        flags.append(exact)
        correct += right
        total += len(reference)
    return {"flags": flags, "exact": sum(flags) / len(flags), "exact_count": sum(flags), "token": correct / total}


def strategy_report(model: Any, sources: tuple[str, ...], references: list[list[int]], max_len: int,
                    batch_size: int, progress: Progress, desc: str, **options: Any) -> dict[str, Any]:
    """Decode and score one strategy: accuracies, exact flags, seconds and sequences per second."""
    found, seconds = decode(model, sources, batch_size, progress, desc, max_decoding_length=max_len, **options)
    ids = model.vocabularies["target"].ids
    figures = score(found, references, max_len, ids.eos, ids.unk)
    return {**figures, "seconds": seconds, "sequences_per_s": len(sources) / seconds if seconds > 0 else None}


def evaluate(model: Any, pairs: Any, beam: int, length_penalty: float, batch_size: int, margin: int,
             progress: Progress = no_progress) -> dict[str, Any]:
    """Greedy and (beam > 0) beam-`beam` figures on `pairs` (`.sources`, `.targets`), and how the two compare;
    both decode at most (longest reference + EOS) + `margin` tokens."""
    references = [model.vocabularies["target"].encode(t, add_eos=False) for t in pairs.targets]
    max_len = max(len(r) for r in references) + 1 + margin
    if model.contract.max_decoding_length is not None:  # a transformer's position table, a fixed output buffer
        max_len = min(max_len, model.contract.max_decoding_length)
    run = {"sources": pairs.sources, "references": references, "max_len": max_len, "batch_size": batch_size,
           "progress": progress}
    greedy = strategy_report(model, desc="greedy", **run)
    result: dict[str, Any] = {"max_decoding_length": max_len, "greedy": greedy, "beam": None}
    if beam > 0:
        found = strategy_report(model, desc=f"beam {beam}", beam_size=beam, length_penalty=length_penalty, **run)
        pairs_of_flags = list(zip(greedy["flags"], found["flags"]))
        lost = sum(g and not b for g, b in pairs_of_flags)
        result["beam"] = {**found, "beam_size": beam, "length_penalty": length_penalty, "lost": lost,
                          "gained": sum(b and not g for g, b in pairs_of_flags), "never_worse": lost == 0}
    for strategy in ("greedy", "beam"):
        if result[strategy] is not None:
            del result[strategy]["flags"]
    return result


def data_warnings(model: Any, pairs: Any) -> tuple[dict[str, float], list[str]]:
    """Unknown-token shares of sources and targets, and a warning for each above UNK_WARN_FRACTION."""
    shares = {side: unknown_fraction(model.vocabularies[side], texts)
              for side, texts in (("source", pairs.sources), ("target", pairs.targets))}
    warnings = [f"{share:.0%} of the {side} tokens are not in the model's {side} vocabulary (they become <unk>"
                f"{'' if side == 'source' else ' and never count as matched'}); the model was likely trained on other "
                "data, or with a --min-freq that left them out" for side, share in shares.items()
                if share > UNK_WARN_FRACTION]
    return shares, warnings


def _rate(figures: dict[str, Any]) -> str:
    rate = figures["sequences_per_s"]
    return "n/a seq/s" if rate is None else f"{rate:,.1f} seq/s"


def format_report(report: dict[str, Any]) -> str:
    """The text eval prints."""
    greedy, beam, n = report["greedy"], report["beam"], report["sequences"]
    lines = [f"model   {report['model']} ({report['precision']}, {', '.join(report['providers'])})",
             (f"data    {report['data']}, {report['split']} split: {n} sequence{'' if n == 1 else 's'} "
              f"(at most {report['max_decoding_length']} decoding steps)"),
             (f"greedy  exact {greedy['exact']:.4f} ({greedy['exact_count']}/{n})  token {greedy['token']:.4f}  "
              f"{_rate(greedy)}")]
    if beam is None:
        lines.append("beam    skipped (--beam 0)")
    else:
        label = f"beam {beam['beam_size']}"
        lines.append(f"{label:<7} exact {beam['exact']:.4f} ({beam['exact_count']}/{n})  token {beam['token']:.4f}  "
                     f"{_rate(beam)}  (length penalty {beam['length_penalty']:g})")
        verdict = "never worse than greedy" if beam["never_worse"] else "worse than greedy on some sequences"
        lines.append(f"beam vs greedy: {verdict} (greedy right, beam wrong: {beam['lost']}; beam right, greedy "
                     f"wrong: {beam['gained']})")
    target = report["target"]
    if target is not None:
        lines.append(f"target  greedy exact >= {target['exact']:g} for {report['data']}: "
                     f"{'met' if target['met'] else 'NOT met'}")
    return "\n".join(lines)
