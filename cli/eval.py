"""`seq2onnx eval`: decode a text data set with an exported token model (onnxruntime) and score it
(`runtime.evaluate`). Greedy and beam both decode at most (longest reference + EOS) + MAX_LEN_MARGIN tokens.

Needs no torch: the data sets (`training.tokens.data`) are numpy + stdlib, and decoding is the runtime's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runtime.evaluate import (
    Progress,
    data_warnings,
    evaluate,
    format_report,
    no_progress,
    readable_pairs,
    short_enough,
)
from runtime.infer_tokens import MAX_BATCH as MAX_BATCH_SIZE
from runtime.search.beam import MAX_BEAM, MAX_LENGTH_PENALTY
from runtime.sessions import PROVIDERS, default_threads
from training.tokens.data import MAX_LEN_MARGIN

from .infer import THREADS_HELP
from .options import FiniteFloatRange, IntRange
from .options import check_threads_option as check_threads

DEFAULT_BEAM = 5
DEFAULT_BATCH_SIZE = 64
SPLITS = ("test", "train")


def check_data_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--data names a built-in set, an existing .tsv file, or two existing files 'SRC,TGT' (else exit 2)."""
    from .train_tokens import check_text_data

    return check_text_data(value, point_data_too=False)


def progress_bar(quiet: bool) -> Progress:
    """A tqdm bar on stderr per strategy, or nothing when --quiet, stderr is not a terminal (a bar that leaves
    nothing left its frames and a carriage return in a log) or tqdm is not installed (the train extra has it)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return no_progress
    return lambda total, desc: tqdm(total=total, desc=desc, unit="seq", file=sys.stderr, disable=True if quiet else None,
                                    leave=False)


def load_pairs(data: str, split: str, limit: int | None) -> Any:
    """The `split` pairs of `data`, the first `limit` of them; unusable content is exit 1."""
    from training.data import DataError
    from training.tokens.data import load_text_dataset

    try:
        train, test = load_text_dataset(data)
    except DataError as err:
        raise click.ClickException(f"--data: {err}") from None
    pairs = test if split == "test" else train
    if limit is not None and limit > len(pairs):  # it scored them all without a word
        click.echo(f"note: --limit {limit} is more than the {len(pairs)} pairs of the {split} split; scoring all "
                   f"{len(pairs)}", err=True)
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


def accuracy_target(data: str, split: str, exact: float) -> dict[str, Any] | None:
    """A built-in set's held-out greedy exact target and whether it was met (test split only)."""
    from training.tokens.builtin import ACCURACY_TARGETS

    if split != "test" or data not in ACCURACY_TARGETS:
        return None
    return {"exact": ACCURACY_TARGETS[data], "met": exact >= ACCURACY_TARGETS[data]}


@click.command("eval", short_help="Held-out accuracy of an exported token model (greedy, beam).")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--data", required=True, callback=check_data_option,
              help="A built-in set (reverse, toy-translation, lookup, dates), a PATH.tsv of 'source<TAB>target' "
                   "lines, or 'SRC_PATH,TGT_PATH' line-aligned files (files: the same 20% held out as in training).")
@click.option("--split", type=click.Choice(SPLITS), default="test", show_default=True,
              help="Score the held-out pairs or the training pairs.")
@click.option("--limit", type=IntRange(min=1), default=None, help="Score only the first N pairs of the split.")
@click.option("--beam", type=IntRange(0, MAX_BEAM), default=DEFAULT_BEAM, show_default=True,
              help="Beam size scored beside greedy; 0 skips beam search.")
@click.option("--length-penalty", type=FiniteFloatRange(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY), default=1.0,
              show_default=True,
              help="Beam score = log-prob / length ** penalty.")
@click.option("--batch-size", type=IntRange(1, MAX_BATCH_SIZE), default=DEFAULT_BATCH_SIZE, show_default=True,
              help="Sources per translate_batch call.")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider; 'cuda' fails clearly where CUDA cannot run.")
@click.option("--threads", type=int, default=None, callback=check_threads, help=THREADS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--min-exact", type=FiniteFloatRange(min=0.0, max=1.0), default=None,
              help="Exit 1 when greedy exact accuracy is below this (after printing the figures).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def eval_command(model_dir: Path, data: str, split: str, limit: int | None, beam: int, length_penalty: float,
                 batch_size: int, provider: str, threads: int | None, as_json: bool, min_exact: float | None,
                 quiet: bool) -> None:
    """Decode --data's held-out pairs with the exported token model in MODEL_DIR and print greedy and beam
    accuracy (exact: the hypothesis stopped with exactly the reference's target ids) and speed."""
    given = click.get_current_context().get_parameter_source("length_penalty") is not ParameterSource.DEFAULT
    if beam == 0 and given:  # as infer refuses it without a beam
        raise click.UsageError("--length-penalty: it scores the beam row, which --beam 0 skips; give --beam N or "
                               "drop --length-penalty")
    model = load_token_model(model_dir, provider, threads)
    pairs, left_out = readable_pairs(model, load_pairs(data, split, limit))
    if left_out:
        total = left_out + (len(pairs.sources) if pairs is not None else 0)
        if pairs is None:
            raise click.ClickException(f"--data {data}: none of the {total} {split} pairs can be read by {model_dir}'s "
                                       "vocabularies, which have no unknown id for the tokens they lack; pass data in "
                                       "the model's own words")
        click.echo(f"note: {left_out} of {total} {split} pairs hold tokens {model_dir}'s vocabularies lack (they "
                   "have no unknown id); left out", err=True)
    total = len(pairs.sources)
    pairs, too_many, why = short_enough(model, pairs)  # it read them all, then stopped at one: "texts[3]: ..."
    if too_many:
        if pairs is None:
            raise click.ClickException(f"--data {data}: none of the {total} {split} pairs has a source that "
                                       f"{model_dir} reads (the first: {why})")
        click.echo(f"note: {too_many} of {total} {split} pairs have a source longer than {model_dir} reads (the "
                   f"first: {why}); left out", err=True)
    shares, warnings = data_warnings(model, pairs)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    from runtime.errors import Seq2OnnxError

    try:
        figures = evaluate(model, pairs, beam, length_penalty, batch_size, MAX_LEN_MARGIN, progress_bar(quiet))
    except Seq2OnnxError as err:
        raise click.ClickException(str(err)) from None
    report = {"model": str(model_dir), "providers": model.providers, "precision": model.manifest.precision,
              "data": data, "split": split,
              "limit": limit, "sequences": len(pairs), "threads": default_threads() if threads is None else threads,
              "unknown_fraction": shares, "warnings": warnings, **figures,
              "target": accuracy_target(data, split, figures["greedy"]["exact"])}
    click.echo(json.dumps(report, sort_keys=True) if as_json else format_report(report))
    if min_exact is not None and figures["greedy"]["exact"] < min_exact:
        raise click.ClickException(f"greedy exact accuracy {figures['greedy']['exact']:.4f} is below --min-exact "
                                   f"{min_exact:g}")
