"""`seq2onnx train`: train on noisy squares or an .npz and write a checkpoint directory.

Only click and the stdlib are imported at module level, so `--help` works without torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runtime.cli import FiniteFloatRange, Interrupted, require_torch
from runtime.spec import ATTENTION_KINDS

from .data import SQUARES

DEFAULT_OUT_ROOT = Path("artifacts") / "checkpoints"
MULTIHEAD_DEFAULT_HEADS = 2
MAX_LR = 1.0  # Adam steps are about lr in size; beyond 1 every weight is thrown around and the run diverges
# Options that define a run. On --resume they default to the saved values; given again, they must match.
RUN_OPTIONS = ("data", "attention", "heads", "hidden_dim", "epochs", "batch_size", "lr", "teacher_forcing", "seed")


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


def _flag(name: str) -> str:
    return "'--" + name.replace("_", "-") + "'"


def _data_key(data: str) -> str:
    """'squares' or the resolved path, so two spellings of one file compare equal."""
    return data if data == SQUARES else str(Path(data).resolve())


def check_data_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--data names 'squares' or an existing .npz file (a wrong name is a usage error, exit 2)."""
    if value is None or value == SQUARES:
        return value
    if not value.endswith(".npz"):
        raise click.BadParameter(f"expected 'squares' or a path ending in .npz, got {value!r}")
    if not Path(value).is_file():
        raise click.BadParameter(f"file {value!r} does not exist; expected 'squares' or an existing .npz file")
    return value


def default_out(data: str, attention: str) -> Path:
    """artifacts/checkpoints/<data name>-<attention>."""
    name = SQUARES if data == SQUARES else Path(data).stem
    return DEFAULT_OUT_ROOT / f"{name}-{attention}"


def resolve_heads(ctx: click.Context, opts: dict[str, Any]) -> int:
    """Heads default to 2 with multihead attention and must be 1 otherwise."""
    if opts["heads"] is None:
        return MULTIHEAD_DEFAULT_HEADS if opts["attention"] == "multihead" else 1
    if opts["heads"] > 1 and opts["attention"] != "multihead":
        raise click.BadParameter(f"{opts['heads']} heads need --attention multihead, "
                                 f"got --attention {opts['attention']}; drop --heads or use multihead",
                                 ctx=ctx, param_hint="'--heads'")
    return opts["heads"]


def merge_saved(ctx: click.Context, opts: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """Options for a resumed run: the saved ones, with --epochs (and only it) free to change."""
    spec, config, data = state["spec"], state["config"], state["data"]
    saved = {"data": data.get("path", SQUARES), "attention": spec["attention"], "heads": spec["n_heads"],
             "hidden_dim": spec["hidden_dim"], **config}
    merged = dict(saved)
    for name in RUN_OPTIONS:
        if not _given(ctx, name):
            continue
        mine, theirs = opts[name], saved[name]
        if name == "data":
            mine, theirs = _data_key(mine), _data_key(theirs)
        if name != "epochs" and mine != theirs:
            raise click.BadParameter(f"the run being resumed used {saved[name]!r}, given {opts[name]!r}; "
                                     "leave the option out to keep the saved value, or start a new run "
                                     "without --resume", ctx=ctx, param_hint=_flag(name))
        merged[name] = opts[name]
    return merged


@click.command("train")
@click.option("--data", default=SQUARES, show_default=True, callback=check_data_option,
              help="'squares' (the book's noisy squares: 256 train, 128 test) or a path to an .npz with float "
                   "arrays source (N, Ls, F) and target (N, Lt, F); 20% of an .npz is held out as test set.")
@click.option("--attention", type=click.Choice(ATTENTION_KINDS), default="dot", show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=None,
              help="Attention heads; multihead only.  [default: 2 for multihead, else 1]")
@click.option("--hidden-dim", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=100, show_default=True,
              help="Total epochs; with --resume, the epoch to continue to.")
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--lr", type=FiniteFloatRange(min=0, max=MAX_LR, min_open=True), default=0.01, show_default=True,
              help="Adam learning rate.")
@click.option("--teacher-forcing", type=FiniteFloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Probability of feeding the true point to the next decoder step while training.")
@click.option("--seed", type=int, default=23, show_default=True, help="Seeds weights, teacher forcing, shuffling.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Checkpoint directory.  [default: artifacts/checkpoints/<data>-<attention>]")
@click.option("--save-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Save the resumable training state every this many epochs.")
@click.option("--resume", is_flag=True,
              help="Continue the interrupted run in OUT.partial, or extend the finished run in OUT to --epochs "
                   "(replacing OUT); other options default to the run's saved values.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (and discard an interrupted run).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def train(ctx: click.Context, out: Path | None, save_every: int, resume: bool, force: bool, quiet: bool,
          **opts: Any) -> None:
    """Train a seq2seq model (GRU encoder-decoder, optional attention) and write a checkpoint directory."""
    require_torch("train")
    if resume and force:
        raise click.BadParameter("--resume continues a run and --force discards it; give one of them",
                                 ctx=ctx, param_hint="'--resume' / '--force'")
    from runtime.errors import Seq2OnnxError
    from runtime.spec import SpecError

    from .atomic import exclusive
    from .checkpoint import CheckpointError, check_checkpoint_destination
    from .data import DataError
    from .destination import normalized
    from .trainer import ConfigError

    out = normalized(out if out is not None else default_out(opts["data"], opts["attention"]))
    try:
        check_checkpoint_destination(out, force=force or resume)  # protected paths: refused before any lock file
        with exclusive(out):  # one writer per --out for the whole run, its .partial state included
            _run(ctx, opts, out, save_every, resume, force, quiet)
    except DataError as err:  # the file exists (checked above) but its content is unusable: exit 1, no usage
        raise click.ClickException(f"--data: {err}") from None
    except (CheckpointError, ConfigError, SpecError, Seq2OnnxError) as err:
        raise click.ClickException(str(err)) from None


def _run(ctx: click.Context, opts: dict[str, Any], out: Path, save_every: int, resume: bool, force: bool,
         quiet: bool) -> None:
    from runtime.contract import CHECKPOINT_STATE_FILE

    from .checkpoint import (check_checkpoint_destination, clear_partial, find_resume_state, load_train_state,
                             partial_dir, save_checkpoint, save_train_state)
    from .data import describe_dataset, load_dataset, reload_dataset
    from .trainer import Trainer, TrainConfig, evaluate, spec_for_data

    # Before any work: where the result goes must be writable without losing anything of the user's.
    check_checkpoint_destination(out, force=force or resume)
    partial, state = partial_dir(out), None
    if resume:
        state_file = find_resume_state(out)
        if state_file is None:
            raise click.BadParameter(f"nothing to resume: neither {partial / CHECKPOINT_STATE_FILE} nor "
                                     f"{out / CHECKPOINT_STATE_FILE} exists; run without --resume to start",
                                     ctx=ctx, param_hint="'--resume'")
        state = load_train_state(state_file)
        opts = merge_saved(ctx, opts, state)
        if state["epoch"] > opts["epochs"]:
            raise click.BadParameter(f"the saved state is at epoch {state['epoch']}, past --epochs {opts['epochs']}; "
                                     f"pass --epochs {state['epoch']} or more", ctx=ctx, param_hint="'--epochs'")
        train_set, test_set = reload_dataset(state["data"])
        description = state["data"]
    else:
        if not force:
            if (partial / CHECKPOINT_STATE_FILE).exists():
                raise click.ClickException(f"an interrupted run is saved in {str(partial)!r}; pass --resume to "
                                           "continue it or --force to discard it and start over")
        clear_partial(out)
        train_set, test_set = load_dataset(opts["data"])
        description = describe_dataset(opts["data"], train_set, test_set)

    spec = spec_for_data(train_set, opts["hidden_dim"], opts["attention"], resolve_heads(ctx, opts))
    config = TrainConfig(epochs=opts["epochs"], batch_size=opts["batch_size"], lr=opts["lr"],
                         teacher_forcing=opts["teacher_forcing"], seed=opts["seed"])
    trainer = Trainer(spec, config, train_set, test_set)
    if state is not None:
        trainer.load_state_dict(state)
        if state_file.parent != partial and trainer.epoch >= config.epochs:
            raise click.BadParameter(f"{str(out)!r} is already trained for {trainer.epoch} epochs; pass a larger "
                                     "--epochs to continue it", ctx=ctx, param_hint="'--epochs'")

    def save_state(t: Trainer) -> None:
        if t.epoch % save_every == 0 or t.epoch == t.config.epochs:
            save_train_state(partial / CHECKPOINT_STATE_FILE, t.state_dict(), description)

    try:
        trainer.fit(save_state, progress=not quiet)
    except KeyboardInterrupt:
        saved = partial / CHECKPOINT_STATE_FILE
        hint = (f"the last saved state is in {str(saved)!r}; rerun with --resume to continue" if saved.exists()
                else "no state was saved yet; rerun to start again")
        raise Interrupted(f"interrupted during epoch {trainer.epoch + 1}; {hint}") from None
    save_checkpoint(out, trainer.model, spec, config, trainer.history, description, trainer.state_dict(),
                    force=force or resume)
    clear_partial(out)
    click.echo(f"checkpoint written to {out}")
    click.echo(f"test MSE: {evaluate(trainer.model, test_set):.5f}")
