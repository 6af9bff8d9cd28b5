"""The token-model part of `seq2onnx train`: text data and tokenizer options, vocabularies, the trainer, and the
held-out accuracy report. Torch is imported only inside `token_job`, so `--help` works without it."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import click

from runtime.defaults import SPEC_OPTIONS
from runtime.spec import ModelSpec
from runtime.vocab import JOINERS
from training.tokens.builtin import ACCURACY_TARGETS, BUILTIN_LOADERS, TOKENIZER_OF
from training.tokens.data import PAIR_SEPARATOR, PARALLEL, TSV, TSV_SUFFIX

from .common import say
from .train_options import TOKENIZER_SUFFIX, given, is_parallel, load_or_reload

BUILT_TOKENIZERS = tuple(JOINERS)  # 'char', 'whitespace': vocabularies built from the training data
USER_DATA_TOKENIZER = "whitespace"


def _must_exist(path: str, what: str) -> None:
    if not Path(path).is_file():
        raise click.BadParameter(f"{what} {path!r} does not exist or is not a file")


def check_text_data(value: str, point_data_too: bool = True) -> str:
    """A built-in text set, an existing PATH.tsv, or two existing files 'SRC_PATH,TGT_PATH'; else BadParameter
    (naming point data too where the command also takes it)."""
    if value in BUILTIN_LOADERS:
        return value
    if not value.strip():
        raise click.BadParameter(f"expected a built-in data set name or a data file, got an empty value {value!r}")
    if value.lower().endswith(TSV_SUFFIX) and not is_parallel(value):  # in any case, as .npz
        _must_exist(value, "file")
        return value
    if is_parallel(value):
        parts = [p.strip() for p in value.split(PAIR_SEPARATOR)]
        if len(parts) != 2 or not all(parts):
            raise click.BadParameter(f"expected two files 'SRC_PATH{PAIR_SEPARATOR}TGT_PATH' (names without a "
                                     f"'{PAIR_SEPARATOR}' in this form), got {value!r}")
        for part, side in zip(parts, ("source", "target")):
            _must_exist(part, f"{side} file")
        return value
    if Path(value).is_dir():
        raise click.BadParameter(f"{value!r} is a directory; expected a data file or a built-in data set name")
    suffix = Path(value).suffix.lower()
    hint = (f" (the file exists, but only the suffix {TSV_SUFFIX} marks a TSV file; rename it, or pass two "
            f"line-aligned files SRC{PAIR_SEPARATOR}TGT)" if Path(value).is_file() and suffix != ".npz" else "")
    if point_data_too and suffix == ".npy" and Path(value).is_file():  # one array, where a data set takes two
        hint = (" (an .npy file holds one array; point data is an .npz holding 'source' (N, Ls, F) and 'target' (N, "
                "Lt, F): np.savez(PATH, source=..., target=...))")
    if not point_data_too and (value == "squares" or suffix == ".npz"):  # what only a point model takes
        hint = " (point data: eval scores token models on text; `seq2onnx infer` decodes a point model's sources)"
    tokens = f"{', '.join(BUILTIN_LOADERS)}, PATH{TSV_SUFFIX} or SRC_PATH{PAIR_SEPARATOR}TGT_PATH"
    expected = f"'squares' or PATH.npz (point models), or {tokens} (token models)" if point_data_too else tokens
    raise click.BadParameter(f"expected {expected}; got {value!r}{hint}")  # worded alike by eval, verify and train


def check_tokenizer_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--tokenizer is 'char', 'whitespace' or an existing tokenizers JSON file."""
    if value is None or value in BUILT_TOKENIZERS:
        return value
    if not value.endswith(TOKENIZER_SUFFIX):
        raise click.BadParameter(f"expected {' or '.join(map(repr, BUILT_TOKENIZERS))}, or a Hugging Face tokenizers "
                                 f"file PATH{TOKENIZER_SUFFIX}; got {value!r}")
    _must_exist(value, "tokenizer file")
    return value


def saved_text_data(description: dict[str, Any]) -> str:
    """The --data value a text description came from (built-in name, TSV path, or 'SRC,TGT')."""
    name = description.get("name")
    if name == TSV:
        return str(description.get("path"))
    if name == PARALLEL:
        return f"{description.get('source_path')}{PAIR_SEPARATOR}{description.get('target_path')}"
    return str(name)


REPORT_OPTIONS = "report_options"  # the training state's record of how the final report was asked for


def saved_token_options(state: dict[str, Any]) -> dict[str, Any]:
    """The options a token run was started with, from its training state."""
    vocab_options = state.get("vocab_options")
    if not isinstance(vocab_options, dict):
        from training.checkpoint import CheckpointError

        raise CheckpointError("the training state lacks 'vocab_options' (tokenizer, min_freq, max_vocab); it was "
                              "not written by seq2onnx train: start a new run without --resume")
    from training.tokens.trainer import (
        TokenTrainConfig,  # (resuming: torch is loaded already)
    )

    spec = ModelSpec.from_dict(state["spec"])
    model = {name: getattr(spec, name) for name in SPEC_OPTIONS}  # a transformer's widths: d_model, as it was built
    config = TokenTrainConfig.from_dict(state["config"]).to_dict()  # fields added since then: their defaults
    report = state.get(REPORT_OPTIONS, {})  # (states saved before it was kept: the defaults)
    return {"data": saved_text_data(state["data"]), "heads": spec.n_heads, **model, **config, **vocab_options,
            **report}


def vocab_options(opts: dict[str, Any]) -> dict[str, Any]:
    """How the vocabularies are made: the tokenizer (default: the built-in's kind, else whitespace), as saved."""
    tokenizer = opts["tokenizer"]
    if tokenizer is None:
        tokenizer = TOKENIZER_OF.get(opts["data"], USER_DATA_TOKENIZER)
    elif tokenizer.endswith(TOKENIZER_SUFFIX):
        tokenizer = str(Path(tokenizer).resolve())
    return {"tokenizer": tokenizer, "min_freq": opts["min_freq"], "max_vocab": opts["max_vocab"]}


def build_vocabularies(train: Any, tokenizer: str, min_freq: int, max_vocab: int | None) -> tuple[Any, Any]:
    """(source, target) vocabularies: one tokenizer file for both sides, or each built from its side's texts."""
    from runtime.vocab import (
        SPECIAL_TOKENS,
        TokenizerUnavailableError,
        VocabError,
        Vocabulary,
    )

    if tokenizer.endswith(TOKENIZER_SUFFIX):
        try:
            vocab = Vocabulary.from_tokenizer_file(tokenizer)
        except (VocabError, TokenizerUnavailableError) as err:  # the file exists, its content is unusable: exit 1
            raise click.ClickException(f"--tokenizer {tokenizer}: {err}") from None
        return vocab, vocab
    built = [Vocabulary.build(texts, tokenizer, min_freq, max_vocab) for texts in (train.sources, train.targets)]
    for side, vocab in zip(("source", "target"), built):
        if len(vocab) <= len(SPECIAL_TOKENS):
            raise click.BadParameter(f"keeps no {side} token of the training data (each is seen fewer than "
                                     f"{min_freq} times); lower it", param_hint="'--min-freq'")
    return built[0], built[1]


def token_job(ctx: click.Context, opts: dict[str, Any], state: dict[str, Any] | None, dist: Any = None) -> Any:
    """Load (or reload) the text, build vocabularies, spec, config and trainer."""
    from training.run import Job
    from training.tokens.data import (
        describe_text_dataset,
        load_text_dataset,
        reload_text_dataset,
    )
    from training.tokens.trainer import TokenTrainConfig, TokenTrainer, check_token_lengths, spec_for_text

    train_set, test_set, description = load_or_reload(opts["data"], state, load_text_dataset,
                                                      describe_text_dataset, reload_text_dataset, given(ctx, "data"))
    how = vocab_options(opts)
    try:
        source_vocab, target_vocab = build_vocabularies(train_set, **how)
    except click.ClickException as err:
        if state is None or not how["tokenizer"].endswith(TOKENIZER_SUFFIX) or Path(how["tokenizer"]).is_file():
            raise
        raise click.ClickException(f"{err.message}; the run being resumed read it: if it moved, give --tokenizer "
                                   "with its new path (the same vocabulary)") from None
    spec = spec_for_text(train_set, source_vocab, target_vocab, n_heads=opts["heads"],
                         **{name: opts[name] for name in SPEC_OPTIONS})
    check_token_lengths(spec, source_vocab, target_vocab, train_set, test_set)
    config = TokenTrainConfig(**{f.name: opts[f.name] for f in dataclasses.fields(TokenTrainConfig)})
    trainer = TokenTrainer(spec, config, train_set, test_set, source_vocab, target_vocab, dist)
    if dist is None or dist.is_main:
        warn_long_warmup(config, len(trainer.batcher), 1 if dist is None else dist.world_size, not given(ctx, "warmup"))

    def report() -> None:
        say(accuracy_line(trainer, test_set, description, opts["eval_beam"]), err=False)

    return Job(trainer, description, report, (source_vocab, target_vocab),
               {"vocab_options": how, REPORT_OPTIONS: {"eval_beam": opts["eval_beam"]}})


def warn_long_warmup(config: Any, rows: int, processes: int, default: bool = False) -> None:
    """A warm-up longer than the run keeps the learning rate below --lr to its end: said, as it is rarely meant
    (`default`: the warm-up is the model's default, not given)."""
    per_epoch = math.ceil(math.ceil(rows / processes) / config.batch_size)  # a process's steps (its shard's)
    steps = config.epochs * per_epoch
    if config.warmup > steps:
        say(f"warning: --warmup {config.warmup}{' (the default)' if default else ''} is more optimizer steps than the "
            f"run takes ({steps}: {config.epochs} epoch(s) of {per_epoch}), so the learning rate stays below --lr "
            f"{config.lr:g} to the end")


def accuracy_line(trainer: Any, test: Any, description: dict[str, Any], beam_size: int) -> str:
    """'held-out (N): greedy exact E, token T | beam K exact B | target >= X: met' (parts left out as they apply).
    The greedy figures are the last epoch's validation, which ran on `test` with these very weights."""
    from training.tokens.evaluate import evaluate_beam

    exact, token = trainer.history["val_exact"][-1], trainer.history["val_token"][-1]
    which = "test = training set" if description.get("test_is_train") else "held-out"
    parts = [f"{which} ({len(test)}): greedy exact {exact:.4f}, token {token:.4f}"]
    if beam_size > 0:
        beam = evaluate_beam(trainer.model, test, trainer.source_vocab, trainer.target_vocab, beam_size)
        parts.append(f"beam {beam_size} exact {beam:.4f}")
    target = ACCURACY_TARGETS.get(description.get("name", ""))
    if target is not None:
        parts.append(f"target >= {target:g}: {'met' if exact >= target else 'NOT met'}")
    return " | ".join(parts)
