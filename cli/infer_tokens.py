"""The token models' side of `seq2onnx infer`: their decoding options, and the usage errors of their command line
(which options go together, which belong to point models)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

import click
from click.core import ParameterSource

from runtime.defaults import JSONL_SUFFIX, MAX_TARGET_LEN, TSV_SUFFIX
from runtime.errors import Seq2OnnxError
from runtime.infer_tokens import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCH,
    POINT_SUFFIXES,
    SAMPLING,
    TOKEN_ONLY,
)
from runtime.manifest import read_manifest
from runtime.search.beam import MAX_BEAM, MAX_LENGTH_PENALTY
from runtime.search.sampling import MAX_SEED
from runtime.tokens import undecoded

from .common import say
from .options import FiniteFloatRange, IntRange, NormalFloatRange


def token_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the token models' decoding options (CTranslate2's translate_batch options under CLI names)."""
    options = [
        click.option("--beam", type=IntRange(1, MAX_BEAM), default=1, show_default=True,
                     help="Token models: beam size (1 = greedy)."),
        click.option("--n-best", type=IntRange(1, MAX_BEAM), default=1, show_default=True,
                     help="Token models: hypotheses per input, best first (at most --beam)."),
        click.option("--max-len", type=IntRange(1, MAX_TARGET_LEN), default=None,
                     help="Token models: most output tokens (default: the model's target_len; a transformer's "
                          "at most its max_positions)."),
        click.option("--min-len", type=IntRange(0, MAX_TARGET_LEN), default=0, show_default=True,
                     help="Token models: fewest output tokens before </s> may end an output."),
        click.option("--length-penalty", type=FiniteFloatRange(-MAX_LENGTH_PENALTY, MAX_LENGTH_PENALTY), default=None,
                     help="Token models, with --beam > 1: score = log-prob / length ** penalty (default 1)."),
        click.option("--sample", is_flag=True, help="Token models: draw each token at random instead of searching."),
        click.option("--top-k", type=IntRange(0), default=None,
                     help="With --sample: draw among the k likeliest tokens (default 0: all)."),
        click.option("--top-p", type=NormalFloatRange(0, 1, min_open=True), default=None,
                     help="With --sample: draw among the likeliest tokens holding this much probability (default 1)."),
        click.option("--temperature", type=NormalFloatRange(0, min_open=True), default=None,
                     help="With --sample: > 1 flattens, < 1 sharpens the distribution (default 1)."),
        click.option("--seed", type=IntRange(0, MAX_SEED), default=None,
                     help="With --sample: the same seed and --batch-size repeat the same draws."),
        click.option("--batch-size", type=IntRange(1, MAX_BATCH), default=DEFAULT_BATCH_SIZE,
                     show_default=True, help="Token models: inputs decoded together; bounds memory on big files."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def model_kind(model_dir: Path) -> str:
    """'points' or 'tokens' from the manifest; one that cannot be read is refused first (status 1), before options
    whose meaning hangs on the kind (a .txt --input is refused for a point model)."""
    try:
        return read_manifest(model_dir).spec.kind
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


def _given(ctx: click.Context, names: Iterable[str]) -> list[str]:
    """The options among `names` that the user gave, as they are spelled on the command line."""
    params = {p.name: p for p in ctx.command.params}
    return [params[n].opts[0] for n in names if ctx.get_parameter_source(n) is not ParameterSource.DEFAULT]


def refuse_token_options(ctx: click.Context, model_dir: Path, input_path: str | None) -> None:
    """A point model given --text or decoding options, no --input, or an --input it cannot read (as a token model
    given a .npy): usage errors naming them."""
    given = _given(ctx, TOKEN_ONLY)
    if given:
        raise click.UsageError(f"{', '.join(given)}: {model_dir} is a point model, which reads numeric sources "
                               "from --input (.npy, .npz, .json, or '-' for JSON) and decodes --target-len points; "
                               "these options are for token models")
    if input_path is None:
        raise click.UsageError("Missing option '--input'.")
    suffix = Path(input_path).suffix.lower()
    if input_path != "-" and suffix not in POINT_SUFFIXES:
        got = f"a {suffix} file" if suffix else "no suffix"
        raise click.UsageError(f"--input: {input_path}: {model_dir} is a point model, which reads a .npy, .npz or "
                               f"JSON file, or '-' for JSON on stdin; got {got}")


def argv_text(text: str) -> str:
    """A --text as the UTF-8 its bytes were: Python decodes argv by the locale, so in a C or POSIX locale (with
    UTF-8 mode off) 'März' came as 'M' and two lone surrogates, and was refused as not UTF-8."""
    if undecoded(text) is None:
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError:  # not UTF-8 whatever the locale: check_token_usage says where
        return text


def check_token_usage(ctx: click.Context, model_dir: Path, input_path: str | None, texts: tuple[str, ...]) -> None:
    """Usage errors of a token model's command line, before any work."""
    if _given(ctx, ["target_len"]):
        raise click.UsageError(f"--target-len: {model_dir} is a token model, whose outputs end at </s>; "
                               "bound their length with --max-len")
    if (input_path is None) == (not texts):
        given = "both were given" if texts else "neither was given"
        raise click.UsageError(f"{model_dir} is a token model: give its inputs either with --text TEXT (repeatable) "
                               f"or with --input FILE ('-' for stdin), one text per line; {given}")
    if input_path is not None and Path(input_path).suffix.lower() in POINT_SUFFIXES:
        raise click.UsageError(f"--input: {input_path}: {model_dir} is a token model, which reads UTF-8 text, one "
                               "input per line; pass a text file, '-' for lines on stdin, or --text")
    if input_path is not None and Path(input_path).suffix.lower() == TSV_SUFFIX:  # pairs everywhere else in seq2onnx
        say(f"note: --input {input_path}: infer reads one source text per line, the whole line; a TSV's tab and "
            f"target column would be read as part of each source (to score pairs: seq2onnx eval {model_dir} "
            f"--data {input_path})")
    if input_path is not None and Path(input_path).suffix.lower() == JSONL_SUFFIX:  # as infer's --output writes
        say(f"note: --input {input_path}: infer reads one source text per line, the whole line; a JSON line's "
            "braces, keys and quotes would be read as part of each source (infer --output writes JSON lines: "
            "give their \"source\" texts, one a line)")
    blank = [i + 1 for i, text in enumerate(texts) if not text.strip()]
    if blank:
        raise click.UsageError(f"--text #{blank[0]} is blank; give each --text some text")
    for i, text in enumerate(texts):
        offset = undecoded(text)
        if offset is not None:  # the shell's bytes were not UTF-8: Python kept each bad byte as a lone surrogate
            at = len(text[:offset].encode("utf-8", "surrogateescape"))  # a byte offset, as --input's
            raise click.UsageError(f"--text #{i + 1}: not UTF-8 (byte {ord(text[offset]) - 0xDC00:#04x} at offset "
                                   f"{at}); give UTF-8 text, as --input requires")


def decoding_options(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """translate_batch's keyword arguments from the CLI's, refusing combinations that would mean nothing."""
    sampling = _given(ctx, SAMPLING)
    if sampling and not values["sample"]:
        verb = "sets" if len(sampling) == 1 else "set"
        raise click.UsageError(f"{', '.join(sampling)} {verb} how --sample draws tokens; add --sample, or drop "
                               f"{'it' if len(sampling) == 1 else 'them'}")
    if values["sample"] and values["beam"] > 1:
        raise click.UsageError(f"--sample draws one output per input and cannot search a beam; drop --beam "
                               f"{values['beam']} or --sample")
    if values["sample"] and values["n_best"] > 1:
        raise click.UsageError(f"--sample draws one output per input, so --n-best {values['n_best']} cannot be met; "
                               "drop --n-best, or drop --sample and use --beam N --n-best K")
    if values["n_best"] > values["beam"]:
        raise click.UsageError(f"--n-best {values['n_best']} is more than --beam {values['beam']}: a beam of N "
                               f"keeps N hypotheses; raise --beam to at least {values['n_best']}")
    if values["length_penalty"] is not None and values["beam"] == 1:
        fix = ("--sample draws one output, with nothing to rank: drop --length-penalty, or drop --sample and add "
               "--beam N (N > 1)" if values["sample"] else "add --beam N (N > 1)")  # --sample refuses --beam
        raise click.UsageError(f"--length-penalty ranks the hypotheses of beam search; {fix}")
    pick = values["sample"]
    return dict(beam_size=values["beam"], num_hypotheses=values["n_best"],
                length_penalty=1.0 if values["length_penalty"] is None else values["length_penalty"],
                max_decoding_length=values["max_len"], min_decoding_length=values["min_len"],
                sampling_topk=(0 if values["top_k"] is None else values["top_k"]) if pick else 1,
                sampling_topp=1.0 if values["top_p"] is None else values["top_p"],
                sampling_temperature=1.0 if values["temperature"] is None else values["temperature"],
                seed=values["seed"])
