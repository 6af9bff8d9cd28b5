"""Shared pieces of `seq2onnx train`: which kind of model the data trains, defaults by kind, option checks, resume
merging. Stdlib, click and numpy only (no torch)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runtime.defaults import POINT_DEFAULTS, arch_defaults
from runtime.spec import POINTS_ATTENTION
from training.points.data import SQUARES
from training.tokens.builtin import BUILTIN_LOADERS
from training.tokens.data import PAIR_SEPARATOR

POINTS, TOKENS = "points", "tokens"
DEFAULT_OUT_ROOT = Path("artifacts") / "checkpoints"
MULTIHEAD_DEFAULT_HEADS = 2
NPZ_SUFFIX = ".npz"
TOKENIZER_SUFFIX = ".json"
RECURRENT_ONLY = ("hidden_dim", "embedding_dim", "cell", "bidirectional", "attention")
TRANSFORMER_ONLY = ("d_model", "d_ff", "dropout", "norm", "positional")
TOKEN_ONLY = ("arch", "embedding_dim", "cell", "layers", "bidirectional", "tie_embeddings", "reverse_source",
              "lr_decay", "warmup", "clip", "label_smoothing", "bucket", "tokenizer", "min_freq", "max_vocab",
              "eval_beam", *TRANSFORMER_ONLY)
FREE_ON_RESUME = ("epochs", "eval_beam")  # how long to train, and how the final report decodes: not the run itself
MOVABLE_ON_RESUME = ("data", "tokenizer")  # files that may have moved: checked by what they hold (data, vocab sha256)
BUILT_VOCAB_ONLY = ("min_freq", "max_vocab")  # a tokenizer file brings its own vocabulary


def load_or_reload(data: str, state: dict[str, Any] | None, load: Callable[[str], tuple[Any, Any]],
                   describe: Callable[[str, Any, Any], dict[str, Any]],
                   reload: Callable[[dict[str, Any]], tuple[Any, Any]],
                   data_given: bool = False) -> tuple[Any, Any, dict[str, Any]]:
    """(train, test, description): read from --data, or on --resume the data the saved description names; a
    --data given on resume may name other files (the data moved) holding the very bytes the run read."""
    from training.data import DataError

    if state is None:
        train, test = load(data)
        return train, test, describe(data, train, test)
    saved = state["data"]
    if data_given:
        train, test = load(data)
        now = describe(data, train, test)
        if _without_paths(now) != _without_paths(saved):
            differ = sorted(k for k in {*_without_paths(now), *_without_paths(saved)}
                            if _without_paths(now).get(k) != _without_paths(saved).get(k))
            raise DataError(f"--data {data}: not the data the run being resumed read ({_named(saved)}; they differ "
                            f"in {', '.join(differ)}); give its files, moved or not, or start a new run without "
                            "--resume")
        return train, test, now
    try:
        train, test = reload(saved)
    except DataError as exc:
        gone = [p for p in _paths(saved) if not Path(p).is_file()]
        if not gone:
            raise
        raise DataError(f"{exc}; the run being resumed read it: if it moved, give --data with its new path (the "
                        "same bytes)") from None
    return train, test, saved


def _is_path(value: Any) -> bool:
    """A file's path (a data file, 'SRC,TGT', a tokenizer .json), not a built-in name ('dates', 'char')."""
    return isinstance(value, str) and (bool(Path(value).suffix) or PAIR_SEPARATOR in value or "/" in value)


DATA_PATH_KEYS = ("path", "source_path", "target_path")  # where a data description names its files


def _paths(description: dict[str, Any]) -> list[str]:
    return [str(description[k]) for k in DATA_PATH_KEYS if description.get(k) is not None]


def _without_paths(description: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in description.items() if k not in DATA_PATH_KEYS}


def _named(description: dict[str, Any]) -> str:
    paths = _paths(description)
    return " and ".join(repr(p) for p in paths) if paths else repr(description.get("name"))


def given(ctx: click.Context, name: str) -> bool:
    """True when the user typed the option (not a default)."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


def flag(name: str, ctx: click.Context | None = None) -> str:
    """'--hidden-dim' for hidden_dim, quoted as click quotes parameter hints; with `ctx`, an on/off flag as it was
    given ('--no-bidirectional' when turned off)."""
    param = next((p for p in ctx.command.params if p.name == name), None) if ctx is not None else None
    if isinstance(param, click.Option) and param.secondary_opts and ctx.params.get(name) is False:
        return f"'{param.secondary_opts[0]}'"
    return "'--" + name.replace("_", "-") + "'"


def is_parallel(data: str) -> bool:
    """'SRC_PATH,TGT_PATH' (two line-aligned text files; the second may end in .tsv, as the runtime reads it), not
    one existing file whose name holds a comma, nor point data."""
    return PAIR_SEPARATOR in data and not data.lower().endswith(NPZ_SUFFIX) and not Path(data).is_file()


def data_kind(data: str) -> str:
    """'points' for squares or an .npz, 'tokens' for text data."""
    return POINTS if data == SQUARES or data.lower().endswith(NPZ_SUFFIX) else TOKENS


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
    """Options not given take their kind's default (token models: their arch's, for some built-in sets that set's)."""
    defaults = arch_defaults(opts["arch"], opts["data"]) if kind == TOKENS else POINT_DEFAULTS
    return {**opts, **{k: v for k, v in defaults.items() if not given(ctx, k)}}


def check_kind_options(ctx: click.Context, kind: str, opts: dict[str, Any]) -> None:
    """Token-only options (and additive attention) are usage errors with point data, recurrent-only ones with
    transformers and transformer-only ones with recurrent models, and the built-vocabulary options are with a
    tokenizer file."""
    if kind == POINTS:
        wrong = [name for name in TOKEN_ONLY if given(ctx, name)]
        if wrong:
            which = "transformer token models (--arch transformer with " if wrong[0] in TRANSFORMER_ONLY else \
                "token models ("
            raise click.BadParameter(f"{flag(wrong[0], ctx)[1:-1]} is for {which}text --data such as reverse, "
                                     f"PATH.tsv or SRC,TGT), but --data {opts['data']} trains a point model; drop the "
                                     "option", ctx=ctx, param_hint=flag(wrong[0], ctx))
        if opts["attention"] not in POINTS_ATTENTION:
            raise click.BadParameter(f"{opts['attention']!r} is for token models; point models take one of "
                                     f"{', '.join(POINTS_ATTENTION)}", ctx=ctx, param_hint="'--attention'")
        return
    _check_arch_options(ctx, opts["arch"])
    tokenizer = opts.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer.endswith(TOKENIZER_SUFFIX):
        wrong = [name for name in BUILT_VOCAB_ONLY if given(ctx, name)]
        if wrong:
            raise click.BadParameter(f"shapes a vocabulary built from the data, but --tokenizer {tokenizer} brings "
                                     "its own; drop one of them", ctx=ctx, param_hint=flag(wrong[0]))


def as_given(ctx: click.Context, name: str) -> str:
    """An option as the user typed it, for a message: '--attention dot', or a flag alone ('--no-bidirectional')."""
    param = next(p for p in ctx.command.params if p.name == name)
    typed = flag(name, ctx)[1:-1]
    return typed if isinstance(param, click.Option) and param.is_flag else f"{typed} {ctx.params.get(name)}"


def _check_arch_options(ctx: click.Context, arch: str) -> None:
    """Options of the other token arch are usage errors, each message saying which arch takes it."""
    if arch == "transformer":
        wrong = [name for name in RECURRENT_ONLY if given(ctx, name)]
        if wrong:
            name = as_given(ctx, wrong[0])
            fix = "size the model with --d-model" if wrong[0] in ("hidden_dim", "embedding_dim") else \
                "drop the option"
            raise click.BadParameter(f"{name} is for recurrent token models, but --arch transformer builds a "
                                     "transformer (multi-head attention, every width d_model); "
                                     f"{fix}, or train a recurrent model (--arch recurrent)",
                                     ctx=ctx, param_hint=flag(wrong[0], ctx))
        return
    wrong = [name for name in TRANSFORMER_ONLY if given(ctx, name)]
    if wrong:
        raise click.BadParameter(f"{as_given(ctx, wrong[0])} is for transformers, but --arch {arch} builds a "
                                 "recurrent model; pass --arch transformer, or drop the option", ctx=ctx,
                                 param_hint=flag(wrong[0], ctx))


def resolve_heads(ctx: click.Context, opts: dict[str, Any], kind: str) -> int:
    """Heads default to 2 with multihead attention and must be 1 otherwise; token models split hidden_dim
    (transformers: d_model) among them, so it must be a multiple."""
    heads = opts["heads"]
    if kind == TOKENS and opts["arch"] == "transformer":
        _check_divides(ctx, opts, "d_model", heads)
        return heads
    if heads is None:
        heads = MULTIHEAD_DEFAULT_HEADS if opts["attention"] == "multihead" else 1
    elif heads > 1 and opts["attention"] != "multihead":
        origin = "" if given(ctx, "attention") else " (the default)"
        raise click.BadParameter(f"{heads} heads need --attention multihead, got --attention {opts['attention']}"
                                 f"{origin}; drop --heads or add --attention multihead", ctx=ctx,
                                 param_hint="'--heads'")
    if kind == TOKENS:
        _check_divides(ctx, opts, "hidden_dim", heads)
    return heads


def _check_divides(ctx: click.Context, opts: dict[str, Any], name: str, heads: int) -> None:
    """The width `name` (d_model, hidden_dim) splits evenly among the heads; a default is said to be one."""
    if opts[name] % heads:
        origin = "" if given(ctx, name) else f" (the default for --data {opts['data']})"
        raise click.BadParameter(f"{flag(name)[1:-1]} {opts[name]}{origin} is not a multiple of {heads} heads (each "
                                 f"head attends in {name} / heads dimensions); pick a head count that divides it",
                                 ctx=ctx, param_hint="'--heads'")


def merge_saved(ctx: click.Context, opts: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """Options for a resumed run: the saved ones, with FREE_ON_RESUME (and only those) free to change."""
    merged = {**opts, **saved}
    for name, theirs in saved.items():
        if not given(ctx, name):
            continue
        moved = name in MOVABLE_ON_RESUME and _is_path(opts[name]) and _is_path(theirs)
        if name not in FREE_ON_RESUME and not moved and option_key(name, opts[name]) != option_key(name, theirs):
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
        # an option that does not fit the resumed run's kind (--cell for a transformer) is said as such first
        check_kind_options(ctx, kind, {**opts, **saved, **{name: opts[name] for name in saved if given(ctx, name)}})
        opts = merge_saved(ctx, opts, saved)
    check_kind_options(ctx, kind, opts)
    return {**opts, "heads": resolve_heads(ctx, opts, kind)}
