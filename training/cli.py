"""`seq2onnx train`: train a point model (squares, .npz) or a token model (built-in or user text) and write a
checkpoint directory. The data decides the kind; both share the destination rules, lock, resume and Ctrl-C handling.

Only click, numpy and the stdlib are imported at module level, so `--help` works without torch.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from runtime.cli import FiniteFloatRange, Interrupted, check_threads_option, require_torch
from runtime.contract import CHECKPOINT_STATE_FILE
from runtime.spec import ARCHS, ATTENTION_KINDS, CELLS, NORMS, POSITIONALS

from .cli_common import (DATASET_DEFAULTS, NPZ_SUFFIX, POINTS, TOKENS, TRANSFORMER_DEFAULTS, Job, data_kind,
                         default_out, load_or_reload, prepare_options, saved_point_options)
from .data import SQUARES
from .launch import LAUNCH_OPTIONS, check_launch, launch, launch_options, launched, quiet_launcher
from .text_data import BUILTIN_LOADERS
from .token_cli import check_text_data, check_tokenizer_option, saved_token_options, token_job

MAX_LR = 1.0  # Adam steps are about lr in size; beyond 1 every weight is thrown around and the run diverges
MAX_WIDTH = 4096  # hidden and embedding sizes: beyond this a model no longer fits the memory of a training machine
MAX_LAYERS = 8
MAX_HEADS = 64
MAX_FF = 4 * MAX_WIDTH  # a transformer's feed-forward blocks are conventionally 4x d_model wide
TEXT_SETS = ", ".join(BUILTIN_LOADERS)


def check_data_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--data names 'squares' or an existing .npz file (a wrong name is a usage error, exit 2)."""
    if value is None or value == SQUARES:
        return value
    if not value.endswith(NPZ_SUFFIX):
        raise click.BadParameter(f"expected 'squares' or a path ending in .npz, got {value!r}")
    if not Path(value).is_file():
        raise click.BadParameter(f"file {value!r} does not exist; expected 'squares' or an existing .npz file")
    return value


def check_train_data_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """train's --data: point data (squares, PATH.npz) or text data (a built-in, PATH.tsv, SRC_PATH,TGT_PATH)."""
    if value is None or data_kind(value) == POINTS:
        return check_data_option(ctx, param, value)
    return check_text_data(value)


def _saved_options(kind: str, state: dict[str, Any]) -> dict[str, Any]:
    return saved_token_options(state) if kind == TOKENS else saved_point_options(state)


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
    """'[default: P for points, T for tokens(, X for transformers)]', X being TRANSFORMER_DEFAULTS[transformer]."""
    also = "" if transformer is None else f", {TRANSFORMER_DEFAULTS[transformer]:g} for transformers"
    return f"[default: {points} for points, {tokens} for tokens{also}]"


def _token_defaults(recurrent: Any, name: str) -> str:
    """'[default: R; transformers: X]' for an option of both token archs."""
    return f"[default: {recurrent}; transformers: {TRANSFORMER_DEFAULTS[name]:g}]"


def _transformer_default(name: str) -> str:
    return f"[default: {TRANSFORMER_DEFAULTS[name]:g}]"


@click.command("train", short_help="Train a point or token model into a checkpoint directory.")
@click.option("--data", default=SQUARES, show_default=True, callback=check_train_data_option,
              help="Point models: 'squares' (the book's noisy squares) or PATH.npz with float arrays source (N, Ls, "
                   f"F) and target (N, Lt, F). Token models: {TEXT_SETS}, PATH.tsv (source<TAB>target lines) or "
                   "SRC_PATH,TGT_PATH (line-aligned files). 20% of a user file is held out as test set. Built-ins with "
                   f"their own defaults for options not given: {_dataset_defaults()}.")
@click.option("--arch", type=click.Choice(ARCHS), default="recurrent", show_default=True,
              help="Token models: a GRU/LSTM encoder-decoder with attention, or a transformer.")
@click.option("--attention", type=click.Choice(ATTENTION_KINDS), default="dot", show_default=True,
              help="additive: token models only; not for transformers (always multi-head).")
@click.option("--heads", type=click.IntRange(1, MAX_HEADS), default=None,
              help="Attention heads: multihead attention (token models: must divide --hidden-dim), or a "
                   "transformer's (must divide --d-model).  [default: 2 for multihead, "
                   f"{TRANSFORMER_DEFAULTS['heads']} for transformers, else 1]")
@click.option("--hidden-dim", type=click.IntRange(1, MAX_WIDTH), default=None,
              help=f"Point and recurrent models.  {_kind_defaults(2, 128)}")
@click.option("--epochs", type=click.IntRange(min=1), default=None,
              help="Total epochs; with --resume, the epoch to continue to.  "
                   f"{_kind_defaults(100, 12, 'epochs')}")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help=_kind_defaults(16, 64))
@click.option("--lr", type=FiniteFloatRange(min=0, max=MAX_LR, min_open=True), default=None,
              help=f"Adam learning rate.  {_kind_defaults(0.01, 0.003, 'lr')}")
@click.option("--teacher-forcing", type=FiniteFloatRange(0.0, 1.0), default=None,
              help="Probability of feeding the true previous point / token to the next decoder step while training "
                   f"(token models: < 1 is scheduled sampling).  {_kind_defaults(0.5, 1.0)}")
@click.option("--seed", type=int, default=23, show_default=True, help="Seeds weights, teacher forcing, shuffling.")
# -- token models only --
@click.option("--cell", type=click.Choice(CELLS), default=None,
              help="Recurrent token models: the cell.  [default: gru]")
@click.option("--layers", type=click.IntRange(1, MAX_LAYERS), default=None,
              help=f"Token models: layers of the encoder and of the decoder.  {_token_defaults(1, 'layers')}")
@click.option("--bidirectional/--no-bidirectional", default=None,
              help="Recurrent token models: a bidirectional encoder.  [default: bidirectional]")
@click.option("--embedding-dim", type=click.IntRange(1, MAX_WIDTH), default=None,
              help="Recurrent token models: embedding size.  [default: 32]")
@click.option("--d-model", type=click.IntRange(1, MAX_WIDTH), default=None,
              help="Transformers: the model width (embeddings, attention, every layer).  "
                   f"{_transformer_default('d_model')}")
@click.option("--d-ff", type=click.IntRange(1, MAX_FF), default=None,
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
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Token models: optimizer steps over which the lr ramps up linearly from lr/N to lr, 0 for none.  "
                   f"{_token_defaults(0, 'warmup')}")
@click.option("--bucket/--no-bucket", default=None,
              help="Token models: batch sources of similar length together.  [default: bucket]")
@click.option("--tokenizer", default=None, callback=check_tokenizer_option,
              help="Token models: 'char', 'whitespace', or a Hugging Face tokenizers PATH.json used for both sides.  "
                   "[default: the built-in set's kind; whitespace for user files]")
@click.option("--min-freq", type=click.IntRange(min=1), default=None,
              help="Token models: keep tokens seen at least this often in training.  [default: 1]")
@click.option("--max-vocab", type=click.IntRange(min=5), default=None,
              help="Token models: at most this many tokens per side, the 4 specials included.  [default: no limit]")
@click.option("--eval-beam", type=click.IntRange(min=0), default=None,
              help="Token models: beam size of the final held-out accuracy (PyTorch); 0 skips it.  [default: 5]")
# -- the run --
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Checkpoint directory.  [default: artifacts/checkpoints/<data>-<attention>, "
                   "<data>-transformer for transformers]")
@click.option("--save-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Save the resumable training state every this many epochs.")
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
    quieted = launching and quiet_launcher()
    if not resume:  # usage mistakes first, before torch loads; a resumed run's options are checked once it is read
        opts = prepare_options(ctx, opts, data_kind(opts["data"]), None)
    require_torch("train")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from runtime.errors import Seq2OnnxError
    from runtime.spec import SpecError

    from .atomic import exclusive
    from .checkpoint import CheckpointError, check_checkpoint_destination, partial_dir
    from .data import DataError
    from .destination import normalized
    from .distributed import PeerFailedError, start, stop
    from .trainer import ConfigError

    name = "transformer" if opts["arch"] == "transformer" else opts["attention"]
    out = normalized(out if out is not None else default_out(opts["data"], name))
    dist = None
    try:
        if launching:  # every rank runs this command again, under torchrun
            check_checkpoint_destination(out, force=force or resume)
            with exclusive(out):  # a run writing there already is said first, before what its files look like
                _check_resumable(ctx, out, resume, force)
            launch(ctx, launch_opts, threads, partial_dir(out) / CHECKPOINT_STATE_FILE, quieted)
            return
        dist = start() if launched() else None
        _run(ctx, opts, out, save_every, resume, force, quiet, dist)
    except DataError as err:  # the file exists (checked above) but its content is unusable: exit 1, no usage
        raise _on_rank(dist, click.ClickException(f"--data: {err}")) from None
    except (CheckpointError, ConfigError, SpecError, Seq2OnnxError) as err:
        raise _on_rank(dist, click.ClickException(str(err))) from None
    except click.ClickException as err:
        raise _on_rank(dist, err) from None
    except PeerFailedError as err:  # while rank 0 prepared the run, or before the first epoch
        prefix = "" if dist is None or dist.is_main else _rank_prefix(dist)
        raise click.ClickException(f"{prefix}{err}; nothing was written") from None
    finally:
        if dist is not None:
            stop()


def _on_rank(dist: Any, err: click.ClickException) -> click.ClickException | click.exceptions.Exit:
    """A user error as rank 0 reports it; the other ranks, which meet the same error, exit quietly with its
    status (one message per run, not one per process)."""
    if dist is None or dist.is_main or isinstance(err, Interrupted) or getattr(err, "this_rank", False):
        return err
    return click.exceptions.Exit(err.exit_code)


def _rank_prefix(dist: Any) -> str:
    return f"rank {dist.rank}: "


def _check_resumable(ctx: click.Context, out: Path, resume: bool, force: bool) -> None:
    """Before any process starts: --resume needs a saved state, a new run must not overwrite an interrupted one."""
    from .checkpoint import find_resume_state, partial_dir

    if resume and find_resume_state(out) is None:
        raise _nothing_to_resume(ctx, out)
    if not resume and not force and (partial_dir(out) / CHECKPOINT_STATE_FILE).exists():
        raise _interrupted_run(partial_dir(out))


def _nothing_to_resume(ctx: click.Context, out: Path) -> click.BadParameter:
    from .checkpoint import partial_dir

    return click.BadParameter(f"nothing to resume: neither {partial_dir(out) / CHECKPOINT_STATE_FILE} nor "
                              f"{out / CHECKPOINT_STATE_FILE} exists; run without --resume to start",
                              ctx=ctx, param_hint="'--resume'")


def _interrupted_run(partial: Path) -> click.ClickException:
    return click.ClickException(f"an interrupted run is saved in {str(partial)!r}; pass --resume to continue it or "
                                "--force to discard it and start over")


def point_job(ctx: click.Context, opts: dict[str, Any], state: dict[str, Any] | None, dist: Any = None) -> Job:
    """Load (or reload) point data and build spec, config and trainer."""
    from .data import describe_dataset, load_dataset, reload_dataset
    from .trainer import Trainer, TrainConfig, evaluate, spec_for_data

    train_set, test_set, description = load_or_reload(opts["data"], state, load_dataset, describe_dataset,
                                                      reload_dataset)
    spec = spec_for_data(train_set, opts["hidden_dim"], opts["attention"], opts["heads"])
    config = TrainConfig(epochs=opts["epochs"], batch_size=opts["batch_size"], lr=opts["lr"],
                         teacher_forcing=opts["teacher_forcing"], seed=opts["seed"])
    trainer = Trainer(spec, config, train_set, test_set, dist)
    return Job(trainer, description, lambda: click.echo(f"test MSE: {evaluate(trainer.model, test_set):.5f}"))


def _run(ctx: click.Context, opts: dict[str, Any], out: Path, save_every: int, resume: bool, force: bool,
         quiet: bool, dist: Any) -> None:
    """Train and write the checkpoint; under torchrun rank 0 prepares the run (and alone writes), the others
    receive what it prepared."""
    from contextlib import ExitStack

    from .atomic import exclusive
    from .checkpoint import check_checkpoint_destination, clear_partial, partial_dir, save_checkpoint

    if dist is not None:
        _check_same_command(ctx, dist)
    with ExitStack() as held:
        def prepare() -> tuple[dict[str, Any], str, dict[str, Any] | None]:
            check_checkpoint_destination(out, force=force or resume)  # protected paths: refused before any lock
            held.enter_context(exclusive(out))  # one writer per --out for the whole run, its .partial state included
            return _setup(ctx, opts, out, resume, force, dist)

        opts, kind, state = _agree(dist, prepare)
        other_machine = dist is not None and not dist.is_main and dist.local_rank == 0
        if other_machine:
            last = dist.rank + _local_processes() - 1
            ranks = f"rank {dist.rank}" if last == dist.rank else f"ranks {dist.rank}-{last}"
            click.echo(f"this machine runs {ranks} of {dist.world_size}; rank 0 shows the progress and writes "
                       f"{str(out)!r} on its machine")
        saved_state = partial_dir(out) / CHECKPOINT_STATE_FILE  # (out is checked now: it has a name)
        job = (token_job if kind == TOKENS else point_job)(ctx, opts, state, dist)
        job.extra_state["world_size"] = 1 if dist is None else dist.world_size
        trainer = job.trainer
        if state is not None:
            trainer.load_state_dict(state)
        _fit(job, saved_state, save_every, quiet, dist)
        if dist is not None and not dist.is_main:
            _wait_for_the_checkpoint(dist)  # leaving first, a rank could end the run while rank 0 writes
            _leave_together(dist, out)
            if other_machine:
                click.echo(f"training finished on this machine; rank 0 wrote {str(out)!r} on its machine")
            return
        try:
            save_checkpoint(out, trainer.model, trainer.spec, trainer.config, trainer.history, job.description,
                            {**trainer.state_dict(), **job.extra_state}, force=force or resume,
                            vocabularies=job.vocabularies, meta=_distributed_meta(trainer.config, dist))
        except KeyboardInterrupt as err:
            raise Interrupted(f"{_why_stopped(err, dist)} while writing the checkpoint after the last epoch; "
                              f"{str(out)!r} was not written, the trained state is in {str(saved_state)!r}: rerun "
                              "with --resume to write it") from None
        clear_partial(out)
        if dist is not None:
            dist.broadcast(True)  # the checkpoint is written: the other ranks may leave
    click.echo(f"checkpoint written to {out}")
    try:
        if dist is not None:
            _leave_together(dist, out)  # the report needs no other rank
        job.report()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {str(out)!r} was written; only the accuracy report was "
                          "skipped") from None


def _wait_for_the_checkpoint(dist: Any) -> None:
    """A rank other than 0, after the last epoch: wait until rank 0 has written the checkpoint."""
    from .distributed import PeerFailedError

    try:
        dist.broadcast(None)
    except PeerFailedError as err:
        stopped = click.ClickException(f"{_rank_prefix(dist)}{err} after the last epoch, while rank 0 wrote the "
                                       "checkpoint")
        stopped.this_rank = True
        raise stopped from None


def _leave_together(dist: Any, out: Path) -> None:
    """Every rank, once the checkpoint is written: leave the job with the others (`distributed.leave`)."""
    from .distributed import PeerFailedError, leave

    try:
        leave(dist)
    except PeerFailedError as err:
        prefix = "" if dist.is_main else _rank_prefix(dist)
        stopped = click.ClickException(f"{prefix}{err}, after {str(out)!r} was written")
        stopped.this_rank = True
        raise stopped from None


def _setup(ctx: click.Context, opts: dict[str, Any], out: Path, resume: bool, force: bool,
           dist: Any) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """(options, model kind, saved state or None): the saved state read and checked on --resume, else a stale
    interrupted run refused (or, with --force, cleared)."""
    from .checkpoint import clear_partial, find_resume_state, load_train_state, partial_dir

    partial = partial_dir(out)
    from .distributed import RESTART_ENV

    restart = int(os.environ.get(RESTART_ENV, "0"))
    if not resume and restart > 0 and (partial / CHECKPOINT_STATE_FILE).is_file():
        click.echo(f"torchrun started the processes again (restart {restart}): resuming from the last saved state")
        resume = True
    if not resume:
        if not force and (partial / CHECKPOINT_STATE_FILE).exists():
            raise _interrupted_run(partial)
        clear_partial(out)
        return opts, data_kind(opts["data"]), None
    state_file = find_resume_state(out)
    if state_file is None:
        raise _nothing_to_resume(ctx, out)
    state = load_train_state(state_file)
    kind = TOKENS if state["spec"].get("kind") == TOKENS else POINTS
    opts = prepare_options(ctx, opts, kind, _saved_options(kind, state))
    if state_file.parent != partial and state["epoch"] >= opts["epochs"]:  # a finished run, extended
        raise click.BadParameter(f"{str(out)!r} is already trained for {state['epoch']} epochs; pass --epochs "
                                 f"{state['epoch'] + 1} or more to continue it", ctx=ctx, param_hint="'--epochs'")
    if state["epoch"] > opts["epochs"]:
        raise click.BadParameter(f"the saved state is at epoch {state['epoch']}, past --epochs {opts['epochs']}; "
                                 f"pass --epochs {state['epoch']} or more", ctx=ctx, param_hint="'--epochs'")
    world_size, saved_size = 1 if dist is None else dist.world_size, int(state.get("world_size", 1))
    if world_size != saved_size:
        batch = opts["batch_size"]
        click.echo(f"resuming a run saved by {saved_size} process(es) on {world_size}: the global batch goes from "
                   f"{batch * saved_size} to {batch * world_size} (--batch-size {batch} per process); the learning "
                   "rate stays as it was")
    return opts, kind, state


PER_MACHINE_OPTIONS = ("threads", "quiet")  # may differ between the machines of one run


def _check_same_command(ctx: click.Context, dist: Any) -> None:
    """Every process runs the same command (but for PER_MACHINE_OPTIONS): machines started with different
    options would otherwise train silently with rank 0's. Said once per machine, by its first process."""
    mine = {name: value for name, value in ctx.params.items() if name not in PER_MACHINE_OPTIONS}
    mine["nproc_per_node"] = _local_processes()  # as torchrun started them, whichever launcher it was
    everyone = dist.gather(mine)
    differ = [(rank, name) for rank, theirs in enumerate(everyone) for name in mine
              if theirs.get(name) != everyone[0].get(name)]
    if not differ:
        return
    if dist.local_rank != 0:
        raise click.exceptions.Exit(click.UsageError.exit_code)
    rank, name = differ[0]
    theirs, main = everyone[rank][name], everyone[0][name]
    err = click.ClickException(
        f"{'' if dist.is_main else _rank_prefix(dist)}the processes of this run were started with different "
        f"options: {_option_name(ctx, name)} is {_shown(theirs)} on rank {rank} but {_shown(main)} on rank 0; "
        "run the same command on every machine; nothing was written")
    err.exit_code = click.UsageError.exit_code  # a usage mistake, as on one machine
    err.this_rank = True  # one line per machine
    raise err


def _option_name(ctx: click.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and isinstance(param, click.Option):
            return param.opts[0]
    return name


def _shown(value: Any) -> str:
    return "not given" if value is None else repr(str(value) if isinstance(value, Path) else value)


def _local_processes() -> int:
    """The processes torchrun started on this machine."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _agree(dist: Any, prepare: Any) -> Any:
    """`prepare()` on rank 0 (or the only process), its result on every rank. When it fails on rank 0, the error is
    raised there and the other ranks exit with the same status (2: a usage error) without a message of their own."""
    if dist is None:
        return prepare()
    from .distributed import PeerFailedError

    if dist.is_main:
        try:
            agreed = prepare()
        except BaseException as err:
            try:
                dist.broadcast(getattr(err, "exit_code", 1))
            except PeerFailedError:
                pass  # the others are gone already; the error at hand is the one to report
            raise
        return dist.broadcast(agreed)
    agreed = dist.broadcast(None)
    if isinstance(agreed, int):
        raise click.exceptions.Exit(agreed)
    return agreed


def _distributed_meta(config: Any, dist: Any) -> dict[str, Any] | None:
    """spec.json's record of a torchrun run: processes, the per-process and the global batch."""
    if dist is None:
        return None
    from .distributed import BACKEND

    return {"distributed": {"world_size": dist.world_size, "backend": BACKEND, "batch_size_per_process":
                            config.batch_size, "global_batch_size": config.batch_size * dist.world_size}}


def _fit(job: Job, state_file: Path, save_every: int, quiet: bool, dist: Any) -> None:
    """Train to the configured epochs, saving the resumable state as asked (rank 0 only); Ctrl-C is exit 130 saying
    what was kept, and so are SIGTERM and the loss of another rank under torchrun."""
    from .checkpoint import save_train_state
    from .distributed import PeerFailedError

    main = dist is None or dist.is_main

    def save_state(t: Any) -> None:
        if main and (t.epoch % save_every == 0 or t.epoch == t.config.epochs):
            save_train_state(state_file, {**t.state_dict(), **job.extra_state}, job.description)

    try:
        job.trainer.fit(save_state, progress=not quiet)
    except (KeyboardInterrupt, PeerFailedError) as err:
        raise _stopped(err, job.trainer.epoch + 1, state_file, dist) from None


def _restarts_left() -> int:
    """How often torchrun will still start the processes again after a failure (--max-restarts)."""
    from .distributed import RESTART_ENV

    return max(0, int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(os.environ.get(RESTART_ENV, "0")))


LAUNCHER_EXIT_S = 0.5  # how long a SIGTERMed rank looks for its launcher's death (a killed one's takes milliseconds)


class _Restarting(click.ClickException):
    """A lost peer while torchrun has restarts left: news (it starts the processes again), not an error."""

    def show(self, file: Any = None) -> None:
        click.echo(self.format_message(), err=True)


def _why_stopped(err: BaseException, dist: Any = None) -> str:
    """Why a run stopped early, in a few words."""
    from .distributed import PeerFailedError, Terminated

    if isinstance(err, PeerFailedError):
        return str(err)
    if isinstance(err, Terminated):
        if dist is not None and dist.launcher_died(within=LAUNCHER_EXIT_S):
            return f"stopped: its launcher (pid {dist.launcher}) died"
        return "stopped by SIGTERM (torchrun stops every process when one of them fails or it is interrupted)"
    return "interrupted"


def _stopped(err: BaseException, epoch: int, state_file: Path, dist: Any) -> BaseException:
    """One line for a run that stopped early: why, in which epoch, and what was kept. Under torchrun, a rank other
    than 0 says it only for a lost peer (which rank saw what); stopped by the user, it exits quietly."""
    from .distributed import PeerFailedError, Terminated

    if dist is not None and not dist.is_main and not isinstance(err, PeerFailedError):
        return click.exceptions.Exit(Interrupted("").exit_code)  # (Interrupted: from here on Ctrl-C is ignored)
    why = _why_stopped(err, dist)  # (first: it waits a moment to tell a dead launcher from torchrun's stop)
    hint = (f"the last saved state is in {str(state_file)!r}; rerun with --resume to continue"
            if state_file.exists() else "no state was saved yet; rerun to start again")
    left = 0 if dist is None or dist.launcher_died() else _restarts_left()
    restarting = left > 0 and isinstance(err, PeerFailedError)  # torchrun restarts after a failure, not a stop
    if restarting:
        kept = f"from the last saved state in {str(state_file)!r}" if state_file.exists() else "from the start"
        hint = f"torchrun starts the processes again ({left} restart(s) left) and they continue {kept}"
    elif left and isinstance(err, Terminated):
        hint = f"unless torchrun starts the processes again ({left} restart(s) left; it does after a failure), {hint}"
    message = f"{why} during epoch {epoch}; {hint}"
    if dist is not None and not dist.is_main:  # rank 0 says what was kept
        message = f"{_rank_prefix(dist)}{why} during epoch {epoch}"
    if isinstance(err, PeerFailedError):
        stopped: click.ClickException = (_Restarting if restarting else click.ClickException)(message)
    else:
        stopped = Interrupted(message)  # (from here on a second Ctrl-C is ignored)
    stopped.this_rank = True  # this rank's own news: printed on every rank (see _on_rank)
    return stopped
