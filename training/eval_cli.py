"""`seq2onnx eval`: decode a text data set with an exported token model (onnxruntime) and score it.

Scoring follows the trainer's `evaluate_tokens`, so eval and training report the same figures:
  exact   a hypothesis is exact when its ids equal the reference's target ids (`vocab.encode(target,
          add_eos=False)`) and it stopped by emitting EOS: one cut off at the decoding limit is never exact.
  token   position by position over the reference's ids + EOS, against the hypothesis's ids + EOS (no EOS when it
          was cut off), divided by the number of reference ids + EOS.
Greedy and beam both decode at most (longest reference + EOS) + MAX_LEN_MARGIN tokens.

Needs no torch: the data sets (`training.text_data`) are numpy + stdlib, and decoding is the runtime's.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from runtime.cli import FiniteFloatRange
from runtime.cli import check_threads_option as check_threads
from runtime.sessions import PROVIDERS
from runtime.token_infer import MAX_BATCH as MAX_BATCH_SIZE
from runtime.token_infer import MAX_BEAM

from .text_data import MAX_LEN_MARGIN

DEFAULT_BEAM = 5
DEFAULT_BATCH_SIZE = 64
UNK_WARN_FRACTION = 0.10  # more unknown source tokens than this: the data is likely not the model's
SPLITS = ("test", "train")


def check_data_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--data names a built-in set, an existing .tsv file, or two existing files 'SRC,TGT' (else exit 2)."""
    from .token_cli import check_text_data

    return check_text_data(value, point_data_too=False)


def unknown_fraction(vocab: Any, texts: tuple[str, ...]) -> float:
    """The share of the texts' tokens that `vocab` maps to UNK (0 for no tokens)."""
    from runtime.vocab import UNK

    ids = [i for text in texts for i in vocab.encode(text, add_eos=False)]
    return sum(i == UNK for i in ids) / len(ids) if ids else 0.0


def progress_bar(total: int, desc: str, quiet: bool) -> Any:
    """A tqdm bar on stderr, or nothing when --quiet or tqdm is not installed (it comes with the train extra)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return nullcontext(None)
    return tqdm(total=total, desc=desc, unit="seq", file=sys.stderr, disable=quiet, leave=False)


def decode(model: Any, sources: tuple[str, ...], batch_size: int, quiet: bool, desc: str,
           **options: Any) -> tuple[list[list[int]], float]:
    """The best hypothesis's ids per source, and the seconds spent in translate_batch."""
    model.translate_batch([sources[0]], **options)  # warm-up: onnxruntime's first run allocates
    found: list[list[int]] = []
    seconds = 0.0
    with progress_bar(len(sources), desc, quiet) as bar:
        for start in range(0, len(sources), batch_size):
            texts = list(sources[start:start + batch_size])
            begin = time.perf_counter()
            translations = model.translate_batch(texts, **options)
            seconds += time.perf_counter() - begin
            found.extend(hyps[0].ids for hyps in translations)
            if bar is not None:
                bar.update(len(texts))
    return found, seconds


def score(found: list[list[int]], references: list[list[int]], max_len: int) -> dict[str, Any]:
    """Exact flags, exact and token accuracy of hypotheses against references (see the module docstring)."""
    from runtime.vocab import EOS

    flags, correct, total = [], 0, 0
    for ids, ref in zip(found, references):
        predicted = ids + [EOS] if len(ids) < max_len else ids  # shorter than the limit: it stopped at EOS
        reference = ref + [EOS]
        flags.append(predicted == reference)
        correct += sum(p == r for p, r in zip(predicted, reference))
        total += len(reference)
    return {"flags": flags, "exact": sum(flags) / len(flags), "exact_count": sum(flags), "token": correct / total}


def strategy_report(model: Any, sources: tuple[str, ...], references: list[list[int]], max_len: int,
                    batch_size: int, quiet: bool, desc: str, **options: Any) -> dict[str, Any]:
    """Decode and score one strategy: accuracies, exact flags, seconds and sequences per second."""
    found, seconds = decode(model, sources, batch_size, quiet, desc, max_decoding_length=max_len, **options)
    figures = score(found, references, max_len)
    return {**figures, "seconds": seconds, "sequences_per_s": len(sources) / seconds if seconds > 0 else None}


def evaluate(model: Any, pairs: Any, beam: int, length_penalty: float, batch_size: int,
             quiet: bool) -> dict[str, Any]:
    """Greedy and (beam > 0) beam-`beam` figures on `pairs`, and how the two compare."""
    references = [model.vocabularies["target"].encode(t, add_eos=False) for t in pairs.targets]
    max_len = max(len(r) for r in references) + 1 + MAX_LEN_MARGIN
    if model.spec.is_transformer:  # output token t reads row t of its position table
        max_len = min(max_len, model.spec.max_positions)
    run = {"sources": pairs.sources, "references": references, "max_len": max_len, "batch_size": batch_size,
           "quiet": quiet}
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


def load_pairs(data: str, split: str, limit: int | None) -> Any:
    """The `split` pairs of `data`, the first `limit` of them; unusable content is exit 1."""
    from training.data import DataError
    from training.text_data import load_text_dataset

    try:
        train, test = load_text_dataset(data)
    except DataError as err:
        raise click.ClickException(f"--data: {err}") from None
    pairs = test if split == "test" else train
    return pairs.subset(range(min(limit, len(pairs)))) if limit is not None else pairs


def load_token_model(model_dir: Path, provider: str, threads: int | None) -> Any:
    """The exported model; a point model or an unusable export is exit 1 with one line."""
    from runtime.errors import Seq2OnnxError
    from runtime.model import Seq2Seq

    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=threads)
    except Seq2OnnxError as err:
        raise click.ClickException(str(err)) from None
    if model.spec.kind != "tokens":
        raise click.ClickException(f"{model_dir} is a point model (kind {model.spec.kind!r}), which takes numeric "
                                   "sources; eval scores token models on text data (use `seq2onnx infer` for "
                                   "point models)")
    return model


def data_warnings(model: Any, pairs: Any) -> tuple[dict[str, float], list[str]]:
    """Unknown-token shares of sources and targets, and a warning for each above UNK_WARN_FRACTION."""
    shares = {side: unknown_fraction(model.vocabularies[side], texts)
              for side, texts in (("source", pairs.sources), ("target", pairs.targets))}
    warnings = [f"{share:.0%} of the {side} tokens are not in the model's {side} vocabulary (they become <unk>); "
                "the model was likely trained on other data" for side, share in shares.items()
                if share > UNK_WARN_FRACTION]
    return shares, warnings


def accuracy_target(data: str, split: str, exact: float) -> dict[str, Any] | None:
    """A built-in set's held-out greedy exact target and whether it was met (test split only)."""
    from training.text_data import ACCURACY_TARGETS

    if split != "test" or data not in ACCURACY_TARGETS:
        return None
    return {"exact": ACCURACY_TARGETS[data], "met": exact >= ACCURACY_TARGETS[data]}


def _rate(figures: dict[str, Any]) -> str:
    rate = figures["sequences_per_s"]
    return "n/a seq/s" if rate is None else f"{rate:,.1f} seq/s"


def format_report(report: dict[str, Any]) -> str:
    """The text eval prints."""
    greedy, beam, n = report["greedy"], report["beam"], report["sequences"]
    lines = [f"model   {report['model']} ({', '.join(report['providers'])})",
             (f"data    {report['data']}, {report['split']} split: {n} sequence{'' if n == 1 else 's'} "
              f"(at most {report['max_decoding_length']} decoding steps)"),
             (f"greedy  exact {greedy['exact']:.4f} ({greedy['exact_count']}/{n})  token {greedy['token']:.4f}  "
              f"{_rate(greedy)}")]
    if beam is None:
        lines.append("beam    skipped (--beam 0)")
    else:
        lines.append(f"beam {beam['beam_size']:<3}exact {beam['exact']:.4f} ({beam['exact_count']}/{n})  token "
                     f"{beam['token']:.4f}  {_rate(beam)}  (length penalty {beam['length_penalty']:g})")
        verdict = "never worse than greedy" if beam["never_worse"] else "WORSE than greedy on some sequences"
        lines.append(f"beam vs greedy: {verdict} (greedy right, beam wrong: {beam['lost']}; beam right, greedy "
                     f"wrong: {beam['gained']})")
    target = report["target"]
    if target is not None:
        lines.append(f"target  greedy exact >= {target['exact']:g} for {report['data']}: "
                     f"{'met' if target['met'] else 'NOT met'}")
    return "\n".join(lines)


@click.command("eval", short_help="Held-out accuracy of an exported token model (greedy, beam).")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--data", required=True, callback=check_data_option,
              help="A built-in set (reverse, toy-translation, lookup, dates), a PATH.tsv of 'source<TAB>target' "
                   "lines, or 'SRC_PATH,TGT_PATH' line-aligned files (files: the same 20% held out as in training).")
@click.option("--split", type=click.Choice(SPLITS), default="test", show_default=True,
              help="Score the held-out pairs or the training pairs.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Score only the first N pairs of the split.")
@click.option("--beam", type=click.IntRange(0, MAX_BEAM), default=DEFAULT_BEAM, show_default=True,
              help="Beam size scored beside greedy; 0 skips beam search.")
@click.option("--length-penalty", type=FiniteFloatRange(), default=1.0, show_default=True,
              help="Beam score = log-prob / length ** penalty.")
@click.option("--batch-size", type=click.IntRange(1, MAX_BATCH_SIZE), default=DEFAULT_BATCH_SIZE, show_default=True,
              help="Sources per translate_batch call.")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider; 'cuda' fails clearly where CUDA cannot run.")
@click.option("--threads", type=int, default=None, callback=check_threads,
              help="onnxruntime intra-op threads, 1 to the number of usable CPUs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--min-exact", type=FiniteFloatRange(min=0.0, max=1.0), default=None,
              help="Exit 1 when greedy exact accuracy is below this (after printing the figures).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def eval_command(model_dir: Path, data: str, split: str, limit: int | None, beam: int, length_penalty: float,
                 batch_size: int, provider: str, threads: int | None, as_json: bool, min_exact: float | None,
                 quiet: bool) -> None:
    """Decode --data's held-out pairs with the exported token model in MODEL_DIR and print greedy and beam
    accuracy (exact: the hypothesis stopped with exactly the reference's target ids) and speed."""
    model = load_token_model(model_dir, provider, threads)
    pairs = load_pairs(data, split, limit)
    shares, warnings = data_warnings(model, pairs)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    from runtime.errors import Seq2OnnxError

    try:
        figures = evaluate(model, pairs, beam, length_penalty, batch_size, quiet)
    except Seq2OnnxError as err:
        raise click.ClickException(str(err)) from None
    report = {"model": str(model_dir), "providers": model.providers, "data": data, "split": split,
              "limit": limit, "sequences": len(pairs), "threads": threads, "unknown_fraction": shares,
              "warnings": warnings, **figures, "target": accuracy_target(data, split, figures["greedy"]["exact"])}
    click.echo(json.dumps(report, sort_keys=True) if as_json else format_report(report))
    if min_exact is not None and figures["greedy"]["exact"] < min_exact:
        raise click.ClickException(f"greedy exact accuracy {figures['greedy']['exact']:.4f} is below --min-exact "
                                   f"{min_exact:g}")
