"""`seq2onnx train`: train a point model (squares, .npz) or a token model (built-in or user text) and write a
checkpoint directory. The data decides the kind; both share the destination rules, lock, resume and Ctrl-C handling.

Only click, numpy and the stdlib are imported at module level, so `--help` works without torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from runtime.contract import CHECKPOINT_STATE_FILE, partial_dir
from runtime.defaults import DATASET_DEFAULTS, MAX_LR, SEED, TRANSFORMER_DEFAULTS
from runtime.search.beam import MAX_BEAM
from runtime.spec import ATTENTION_KINDS, CELLS, NORMS, POSITIONALS, TRAINABLE_ARCHS
from training.errors import state_unchanged, unchanged
from training.points.data import SQUARES
from training.tokens.builtin import BUILTIN_LOADERS
from training.torchrun import launch_env_problem, launched, partial_launch_env

from .common import kept, require_torch
from .launch import launch, quiet_launcher
from .launch_options import LAUNCH_OPTIONS, check_launch, launch_options
from .options import FiniteFloatRange, IntRange, check_threads_option
from .train_options import (
    NPZ_SUFFIX,
    POINTS,
    data_kind,
    default_out,
    prepare_options,
)
from .train_run import as_click, run_training
from .train_tokens import (
    check_text_data,
    check_tokenizer_option,
)

MAX_WIDTH = 4096  # hidden and embedding sizes: beyond this a model no longer fits the memory of a training machine
MAX_LAYERS = 8
MAX_HEADS = 64
# what torch.manual_seed takes, less the negative seeds it wraps onto others (-1 seeded as 2**64 - 1 does): one run a
# seed, as infer's --seed
MIN_SEED, MAX_SEED = 0, (1 << 64) - 1
MAX_FF = 4 * MAX_WIDTH  # a transformer's feed-forward blocks are conventionally 4x d_model wide
TEXT_SETS = ", ".join(BUILTIN_LOADERS)


def check_data_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--data names 'squares' or an existing .npz file (a wrong name is a usage error, exit 2)."""
    if value is None or value == SQUARES:
        return value
    if not value.lower().endswith(NPZ_SUFFIX):
        raise click.BadParameter(f"expected 'squares' or a path ending in .npz, got {value!r}")
    if not Path(value).is_file():
        raise click.BadParameter(f"file {value!r} does not exist; expected 'squares' or an existing .npz file")
    return value


def check_train_data_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """train's --data: point data (squares, PATH.npz) or text data (a built-in, PATH.tsv, SRC_PATH,TGT_PATH)."""
    if value is None or data_kind(value) == POINTS:
        return check_data_option(ctx, param, value)
    return check_text_data(value)


def _as_options(values: dict[str, Any]) -> str:
    """'--hidden-dim 32, --lr 0.01' (numbers as %g)."""
    def shown(v: Any) -> str:
        return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)

    return ", ".join(f"--{k.replace('_', '-')} {shown(v)}" for k, v in values.items() if v is not None)


def _dataset_defaults() -> str:
    """'recurrent: toy-translation (--hidden-dim 32, ...), lookup (...); transformer: ...' from DATASET_DEFAULTS."""
    return "; ".join(f"{arch}: " + ", ".join(f"{name} ({_as_options(values)})" for name, values in sets.items())
                     for arch, sets in DATASET_DEFAULTS.items() if sets)


def _kind_defaults(points: Any, tokens: Any, transformer: str | None = None) -> str:
    """'[default: P for points, T for tokens(, X for transformers)]', X being TRANSFORMER_DEFAULTS[transformer]
    where it differs from T (transformers are token models)."""
    own = None if transformer is None else f"{TRANSFORMER_DEFAULTS[transformer]:g}"
    also = "" if own is None or own == f"{tokens}" else f", {own} for transformers"
    return f"[default: {points} for points, {tokens} for tokens{also}]"


def _token_defaults(recurrent: Any, name: str) -> str:
    """'[default: R; transformers: X]' for an option of both token archs ('[default: R]' where they agree)."""
    transformer = f"{TRANSFORMER_DEFAULTS[name]:g}"
    if f"{recurrent}" == transformer:
        return f"[default: {recurrent}]"
    return f"[default: {recurrent}; transformers: {transformer}]"


def _transformer_default(name: str) -> str:
    return f"[default: {TRANSFORMER_DEFAULTS[name]:g}]"


@click.command("train", short_help="Train a point or token model into a checkpoint directory.")
@click.option("--data", default=SQUARES, show_default=True, callback=check_train_data_option,
              help="Point models: 'squares' (the book's noisy squares) or PATH.npz with float arrays source (N, Ls, "
                   f"F) and target (N, Lt, F). Token models: {TEXT_SETS}, PATH.tsv (source<TAB>target lines) or "
                   "SRC_PATH,TGT_PATH (line-aligned files). 20% of a user file is held out as test set. Built-ins with "
                   f"their own defaults for options not given: {_dataset_defaults()}.")
@click.option("--arch", type=click.Choice(TRAINABLE_ARCHS), default="recurrent", show_default=True,
              help="Token models: a GRU/LSTM encoder-decoder with attention, or a transformer.")
@click.option("--attention", type=click.Choice(ATTENTION_KINDS), default="dot", show_default=True,
              help="How the decoder weighs the source at each step. none: no attention (the encoder's final state "
                   "carries the source); dot: dot products of the decoder state with the projected source states "
                   "(for points, scaled, with a projected query); additive: Bahdanau's v . tanh(W q + U m), token "
                   "models only; multihead: --heads heads of scaled dot products, each over hidden/heads dims for "
                   "tokens and over the full width for points. Not for transformers (always multi-head).")
@click.option("--heads", type=IntRange(1, MAX_HEADS), default=None,
              help="Attention heads: multihead attention (token models: must divide --hidden-dim), or a "
                   "transformer's (must divide --d-model).  [default: 2 for multihead, "
                   f"{TRANSFORMER_DEFAULTS['heads']} for transformers, else 1]")
@click.option("--hidden-dim", type=IntRange(1, MAX_WIDTH), default=None,
              help=f"Point and recurrent models.  {_kind_defaults(2, 128)}")
@click.option("--epochs", type=IntRange(min=1), default=None,
              help="Total epochs; with --resume, the epoch to continue to.  "
                   f"{_kind_defaults(100, 12, 'epochs')}")
@click.option("--batch-size", type=IntRange(min=1), default=None, help=_kind_defaults(16, 64))
@click.option("--lr", type=FiniteFloatRange(min=0, max=MAX_LR, min_open=True), default=None,
              help=f"Adam learning rate.  {_kind_defaults(0.01, 0.003, 'lr')}")
@click.option("--teacher-forcing", type=FiniteFloatRange(0.0, 1.0), default=None,
              help="Probability of feeding the true previous point / token to the next decoder step while training "
                   f"(token models: < 1 is scheduled sampling).  {_kind_defaults(0.5, 1.0)}")
@click.option("--seed", type=IntRange(MIN_SEED, MAX_SEED), default=SEED, show_default=True,
              help="Seeds weights, teacher forcing, shuffling.")
# -- token models only --
@click.option("--cell", type=click.Choice(CELLS), default=None,
              help="Recurrent token models: the cell.  [default: gru]")
@click.option("--layers", type=IntRange(1, MAX_LAYERS), default=None,
              help=f"Token models: layers of the encoder and of the decoder.  {_token_defaults(1, 'layers')}")
@click.option("--bidirectional/--no-bidirectional", default=None,
              help="Recurrent token models: a bidirectional encoder.  [default: bidirectional]")
@click.option("--embedding-dim", type=IntRange(1, MAX_WIDTH), default=None,
              help="Recurrent token models: embedding size.  [default: 32]")
@click.option("--d-model", type=IntRange(1, MAX_WIDTH), default=None,
              help="Transformers: the model width (embeddings, attention, every layer).  "
                   f"{_transformer_default('d_model')}")
@click.option("--d-ff", type=IntRange(1, MAX_FF), default=None,
              help=f"Transformers: inner width of each feed-forward block.  {_transformer_default('d_ff')}")
@click.option("--dropout", type=FiniteFloatRange(0.0, 1.0, max_open=True), default=None,
              help="Transformers: dropout on embeddings, attention weights and sub-layer outputs while training.  "
                   f"{_transformer_default('dropout')}")
@click.option("--norm", type=click.Choice(NORMS), default=None,
              help="Transformers: LayerNorm before each sub-layer (pre) or after each residual (post).  "
                   "[default: pre]")
@click.option("--positional", type=click.Choice(POSITIONALS), default=None,
              help="Transformers: fixed sinusoidal or learned position embeddings.  [default: sinusoidal]")
@click.option("--tie-embeddings", is_flag=True, default=None,
              help="Token models: the output projection reuses the target embedding.")
@click.option("--reverse-source", is_flag=True, default=None,
              help="Token models: feed source tokens in reverse order (EOS stays last).")
@click.option("--clip", type=FiniteFloatRange(min=0), default=None,
              help="Token models: max global gradient norm, 0 for none.  [default: 1.0]")
@click.option("--label-smoothing", type=FiniteFloatRange(0.0, 1.0, max_open=True), default=None,
              help="Token models: label smoothing of the loss.  [default: 0.0]")
@click.option("--lr-decay", type=FiniteFloatRange(0.0, 1.0, min_open=True), default=None,
              help=f"Token models: epoch e trains at lr * lr_decay**e.  {_token_defaults(0.8, 'lr_decay')}")
@click.option("--warmup", type=IntRange(min=0), default=None,
              help="Token models: optimizer steps over which the lr ramps up linearly from lr/N to lr, 0 for none.  "
                   f"{_token_defaults(0, 'warmup')}")
@click.option("--bucket/--no-bucket", default=None,
              help="Token models: batch sources of similar length together.  [default: bucket]")
@click.option("--tokenizer", default=None, callback=check_tokenizer_option,
              help="Token models: 'char', 'whitespace', or a Hugging Face tokenizers PATH.json used for both sides.  "
                   "[default: the built-in set's kind; whitespace for user files]")
@click.option("--min-freq", type=IntRange(min=1), default=None,
              help="Token models: keep tokens seen at least this often in training.  [default: 1]")
@click.option("--max-vocab", type=IntRange(min=5), default=None,
              help="Token models: at most this many tokens per side, the 4 specials included.  [default: no limit]")
@click.option("--eval-beam", type=IntRange(0, MAX_BEAM), default=None,
              help="Token models: beam size of the final held-out accuracy (PyTorch); 0 skips it.  [default: 5]")
# -- the run --
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Checkpoint directory.  [default: artifacts/checkpoints/<data>-<attention>, "
                   "<data>-transformer for transformers]")
@click.option("--save-every", type=IntRange(min=1), default=1, show_default=True,
              help="Save the resumable training state every this many epochs, and after the last (so a value "
                   "past --epochs saves at the end only).")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted run in OUT.partial, or extend the finished run in OUT to --epochs "
                   "(replacing OUT); other options default to the run's saved values.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (and discard an interrupted run).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--threads", type=int, default=None, callback=check_threads_option,
              help="PyTorch intra-op threads, 1 to the number of usable CPUs (default: PyTorch's choice). On a "
                   "machine that other work keeps busy, fewer threads than cores avoids waiting on descheduled ones.")
@launch_options
@click.pass_context
def train(ctx: click.Context, out: Path | None, save_every: int, resume: bool, force: bool, quiet: bool,
          threads: int | None, **opts: Any) -> None:
    """Train a seq2seq model and write a checkpoint directory: a GRU encoder-decoder on points (squares, .npz), or
    on text (built-in sets, .tsv, parallel files) an embedding GRU/LSTM encoder-decoder or a transformer.

    With --nproc-per-node N, or under torchrun, the same run on N processes (DistributedDataParallel); rank 0
    writes the same checkpoint."""
    launch_opts = {name: opts.pop(name) for name in LAUNCH_OPTIONS}
    if resume and force:
        raise click.BadParameter("--resume continues a run and --force discards it; give one of them",
                                 ctx=ctx, param_hint="'--resume' / '--force'")
    launching = check_launch(ctx, launch_opts, launched(), threads)
    if not launching and (partial := partial_launch_env()) is not None:  # a launcher's workers get the whole set
        raise click.ClickException(partial)
    if launched() and (problem := launch_env_problem()) is not None:  # before torch loads, on every rank
        raise click.ClickException(f"{problem}, in the environment (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, "
                                   "MASTER_ADDR and MASTER_PORT; started otherwise, each process needs all but "
                                   "LOCAL_RANK)")
    quieted = launching and quiet_launcher()
    if not resume:  # usage mistakes first, before torch loads; a resumed run's options are checked once it is read
        opts = prepare_options(ctx, opts, data_kind(opts["data"]), None)
    from runtime.destination import normalized

    name = "transformer" if opts["arch"] == "transformer" else opts["attention"]
    out = normalized(out if out is not None else default_out(opts["data"], name))
    if resume:
        _keeps(out)
    require_torch("train")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from runtime.writer_lock import exclusive
    from training.checkpoint import check_checkpoint_destination
    from training.distributed import start, stop
    from training.run import check_resumable

    dist = None
    try:
        if launching:  # every rank runs this command again, under torchrun
            check_checkpoint_destination(out, force=force or resume)
            if resume:  # nothing to resume is said before the lock, which would make --out's parents
                check_resumable(out, resume, force)
            with exclusive(out):  # a run writing there already is said first, before what its files look like
                check_resumable(out, resume, force)
            state_file = partial_dir(out) / CHECKPOINT_STATE_FILE
            launch(ctx, launch_opts, threads, out, state_file, resume and not state_file.exists(), quieted)
            return
        dist = start() if launched() else None
        run_training(ctx, opts, data_kind(opts["data"]), out, save_every, resume, force, quiet, dist)
    except Exception as err:  # (Ctrl-C before or after the epochs: cli.main says it, or on a quiet rank nothing)
        shown = as_click(err, dist)
        if shown is None:
            raise
        raise shown from None
    finally:
        if dist is not None:
            stop()


def _keeps(out: Path) -> None:
    """A --resume stopped before it saves a state says that what it resumes (an interrupted run's state, else the
    finished `out`) is as it was, with how to go on (cli.common.kept)."""
    state_file = partial_dir(out) / CHECKPOINT_STATE_FILE
    if state_file.is_file():
        kept(state_unchanged(state_file))
    elif (out / CHECKPOINT_STATE_FILE).is_file():
        kept(unchanged(out))
