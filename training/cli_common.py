"""Shared pieces of `seq2onnx train`: which kind of model the data trains, defaults by kind, option checks, resume
merging, and the `Job` each kind hands back to the one run loop. Stdlib, click and numpy only (no torch)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runtime.spec import POINTS_ATTENTION

from .data import SQUARES
from .text_data import BUILTIN_LOADERS, PAIR_SEPARATOR, TSV_SUFFIX

POINTS, TOKENS = "points", "tokens"
DEFAULT_OUT_ROOT = Path("artifacts") / "checkpoints"
MULTIHEAD_DEFAULT_HEADS = 2
NPZ_SUFFIX = ".npz"
TOKENIZER_SUFFIX = ".json"
# The book's defaults for point models (unchanged), and TokenTrainConfig / spec_for_text's for token models
# (a test keeps these equal to the library's). A value None is resolved later (the tokenizer: by the data).
POINT_DEFAULTS: dict[str, Any] = {"hidden_dim": 2, "epochs": 100, "batch_size": 16, "lr": 0.01,
                                  "teacher_forcing": 0.5}
TOKEN_DEFAULTS: dict[str, Any] = {
    "hidden_dim": 128, "embedding_dim": 32, "cell": "gru", "layers": 1, "bidirectional": True,
    "tie_embeddings": False, "reverse_source": False, "epochs": 12, "batch_size": 64, "lr": 3e-3, "lr_decay": 0.8,
    "clip": 1.0, "label_smoothing": 0.0, "teacher_forcing": 1.0, "bucket": True, "tokenizer": None, "min_freq": 1,
    "max_vocab": None, "eval_beam": 5,
}
# Built-in text sets whose size calls for other settings than the token defaults (measured on 2 CPU threads):
# toy-translation is 9 pairs, one batch per epoch at the defaults, so it needs small models and many steps;
# lookup learns position from attention and needs more, smaller steps (0.995 held-out exact after 4 epochs).
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "toy-translation": {"hidden_dim": 32, "embedding_dim": 16, "epochs": 30, "batch_size": 9, "lr": 0.01,
                        "lr_decay": 1.0},
    "lookup": {"epochs": 8, "batch_size": 32, "lr_decay": 0.93},
}
TOKEN_ONLY = ("embedding_dim", "cell", "layers", "bidirectional", "tie_embeddings", "reverse_source", "lr_decay",
              "clip", "label_smoothing", "bucket", "tokenizer", "min_freq", "max_vocab", "eval_beam")
BUILT_VOCAB_ONLY = ("min_freq", "max_vocab")  # a tokenizer file brings its own vocabulary


@dataclass
class Job:
    """One model kind's part of a run: its trainer, the data description, what to save beside the weights
    (vocabularies, extra resumable state), and what to print at the end."""

    trainer: Any
    description: dict[str, Any]
    report: Callable[[], None]
    vocabularies: tuple[Any, Any] | None = None
    extra_state: dict[str, Any] = field(default_factory=dict)


def load_or_reload(data: str, state: dict[str, Any] | None, load: Callable[[str], tuple[Any, Any]],
                   describe: Callable[[str, Any, Any], dict[str, Any]],
                   reload: Callable[[dict[str, Any]], tuple[Any, Any]]) -> tuple[Any, Any, dict[str, Any]]:
    """(train, test, description): read from --data, or on --resume the data the saved description names."""
    if state is None:
        train, test = load(data)
        return train, test, describe(data, train, test)
    train, test = reload(state["data"])
    return train, test, state["data"]


def given(ctx: click.Context, name: str) -> bool:
    """True when the user typed the option (not a default)."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


def flag(name: str) -> str:
    """'--hidden-dim' for hidden_dim, quoted as click quotes parameter hints."""
    return "'--" + name.replace("_", "-") + "'"


def is_parallel(data: str) -> bool:
    """'SRC_PATH,TGT_PATH' (two line-aligned text files)."""
    return PAIR_SEPARATOR in data and not data.endswith((TSV_SUFFIX, NPZ_SUFFIX))


def data_kind(data: str) -> str:
    """'points' for squares or an .npz, 'tokens' for text data."""
    return POINTS if data == SQUARES or data.endswith(NPZ_SUFFIX) else TOKENS


def data_key(data: str) -> str:
    """A built-in name, or the resolved path(s), so two spellings of one file compare equal."""
    if data == SQUARES or data in BUILTIN_LOADERS:
        return data
    if is_parallel(data):
        return PAIR_SEPARATOR.join(str(Path(p.strip()).resolve()) for p in data.split(PAIR_SEPARATOR))
    return str(Path(data).resolve())


def option_key(name: str, value: Any) -> Any:
    """What a resumed run compares: paths resolved, everything else as given."""
    if name == "data":
        return data_key(value)
    if name == "tokenizer" and isinstance(value, str) and value.endswith(TOKENIZER_SUFFIX):
        return str(Path(value).resolve())
    return value


def default_out(data: str, attention: str) -> Path:
    """artifacts/checkpoints/<data name>-<attention>; a file's name without suffix (the source file's for SRC,TGT)."""
    if data == SQUARES or data in BUILTIN_LOADERS:
        name = data
    else:
        name = Path(data.split(PAIR_SEPARATOR)[0].strip() if is_parallel(data) else data).stem
    return DEFAULT_OUT_ROOT / f"{name}-{attention}"


def with_defaults(ctx: click.Context, opts: dict[str, Any], kind: str) -> dict[str, Any]:
    """Options not given take their kind's default (for some built-in text sets, that set's)."""
    defaults = {**TOKEN_DEFAULTS, **DATASET_DEFAULTS.get(opts["data"], {})} if kind == TOKENS else POINT_DEFAULTS
    return {**opts, **{k: v for k, v in defaults.items() if not given(ctx, k)}}


def check_kind_options(ctx: click.Context, kind: str, opts: dict[str, Any]) -> None:
    """Token-only options (and additive attention) are usage errors with point data, and the built-vocabulary
    options are with a tokenizer file."""
    if kind == POINTS:
        wrong = [name for name in TOKEN_ONLY if given(ctx, name)]
        if wrong:
            raise click.BadParameter(f"{flag(wrong[0])[1:-1]} is for token models (text --data such as reverse, "
                                     f"PATH.tsv or SRC,TGT), but --data {opts['data']} trains a point model; "
                                     "drop the option", ctx=ctx, param_hint=flag(wrong[0]))
        if opts["attention"] not in POINTS_ATTENTION:
            raise click.BadParameter(f"{opts['attention']!r} is for token models; point models take one of "
                                     f"{', '.join(POINTS_ATTENTION)}", ctx=ctx, param_hint="'--attention'")
        return
    tokenizer = opts.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer.endswith(TOKENIZER_SUFFIX):
        wrong = [name for name in BUILT_VOCAB_ONLY if given(ctx, name)]
        if wrong:
            raise click.BadParameter(f"shapes a vocabulary built from the data, but --tokenizer {tokenizer} brings "
                                     "its own; drop one of them", ctx=ctx, param_hint=flag(wrong[0]))


def resolve_heads(ctx: click.Context, opts: dict[str, Any], kind: str) -> int:
    """Heads default to 2 with multihead attention and must be 1 otherwise; token models split hidden_dim
    among them, so it must be a multiple."""
    heads = opts["heads"]
    if heads is None:
        heads = MULTIHEAD_DEFAULT_HEADS if opts["attention"] == "multihead" else 1
    elif heads > 1 and opts["attention"] != "multihead":
        raise click.BadParameter(f"{heads} heads need --attention multihead, got --attention {opts['attention']}; "
                                 "drop --heads or use multihead", ctx=ctx, param_hint="'--heads'")
    if kind == TOKENS and opts["hidden_dim"] % heads:
        raise click.BadParameter(f"--hidden-dim {opts['hidden_dim']} is not a multiple of {heads} heads (each head "
                                 "attends in hidden_dim / heads dimensions); pick a head count that divides it",
                                 ctx=ctx, param_hint="'--heads'")
    return heads


def saved_point_options(state: dict[str, Any]) -> dict[str, Any]:
    """The options a point run was started with, from its training state."""
    spec = state["spec"]
    return {"data": state["data"].get("path", SQUARES), "attention": spec["attention"], "heads": spec["n_heads"],
            "hidden_dim": spec["hidden_dim"], **state["config"]}


def merge_saved(ctx: click.Context, opts: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """Options for a resumed run: the saved ones, with --epochs (and only it) free to change."""
    merged = {**opts, **saved}
    for name, theirs in saved.items():
        if not given(ctx, name):
            continue
        if name != "epochs" and option_key(name, opts[name]) != option_key(name, theirs):
            raise click.BadParameter(f"the run being resumed used {theirs!r}, given {opts[name]!r}; leave the option "
                                     "out to keep the saved value, or start a new run without --resume",
                                     ctx=ctx, param_hint=flag(name))
        merged[name] = opts[name]
    return merged


def prepare_options(ctx: click.Context, opts: dict[str, Any], kind: str,
                    saved: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults for the kind, the saved options of a resumed run, then every cross-option check."""
    opts = with_defaults(ctx, opts, kind)
    if saved is not None:
        opts = merge_saved(ctx, opts, saved)
    check_kind_options(ctx, kind, opts)
    return {**opts, "heads": resolve_heads(ctx, opts, kind)}
