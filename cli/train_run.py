"""`seq2onnx train` once its options are checked: the typed run (`training.run`) with this command's hooks (a
resumed run's options, each kind's job, progress lines), and what it raises turned into the command's messages
and exit statuses. Torch is imported only when a run starts, so `--help` works without it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from runtime.errors import Seq2OnnxError, UsageError

from .common import say
from .signals import Interrupted
from .train_options import POINTS, TOKENS, prepare_options
from .train_points import point_job, saved_point_options
from .train_tokens import saved_token_options, token_job


@dataclass(frozen=True)
class TrainKind:
    """One model kind's part of `train`: its Job (data, trainer, report), and the options a saved run was started
    with."""

    job: Callable[[click.Context, dict[str, Any], dict[str, Any] | None, Any], Any]
    saved_options: Callable[[dict[str, Any]], dict[str, Any]]


# The one place the data's (or a resumed run's) kind picks what `train` builds.
KINDS = {POINTS: TrainKind(point_job, saved_point_options), TOKENS: TrainKind(token_job, saved_token_options)}


def run_training(ctx: click.Context, opts: dict[str, Any], kind: str, out: Path, save_every: int, resume: bool,
                 force: bool, quiet: bool, dist: Any) -> None:
    """`training.run.run` with this command's plan and hooks."""
    from training.run import RunHooks, RunPlan, run

    command = {name: value for name, value in ctx.params.items()}
    flags = {p.name: p.opts[0] for p in ctx.command.params if isinstance(p, click.Option) and p.name}
    plan = RunPlan(out=out, kind=kind, options=opts, save_every=save_every, resume=resume, force=force, quiet=quiet,
                   command=command, flags=flags)
    hooks = RunHooks(
        resumed_options=lambda kind, state: prepare_options(ctx, opts, kind, KINDS[kind].saved_options(state)),
        job=lambda kind, options, state, dist: KINDS[kind].job(ctx, options, state, dist),
        say=lambda line: say(line, err=False))  # a message: one stdout cannot take is dropped
    run(plan, hooks, dist)


class Restarting(click.ClickException):
    """A lost peer while torchrun has restarts left: news (it starts the processes again), not an error."""

    def show(self, file: Any = None) -> None:
        click.echo(self.format_message(), err=True)


def on_rank(dist: Any, err: click.ClickException) -> click.ClickException | click.exceptions.Exit:
    """A user error as rank 0 reports it; the other ranks, which meet the same error, exit quietly with its
    status (one message per run, not one per process)."""
    if dist is None or dist.is_main or isinstance(err, Interrupted) or getattr(err, "this_rank", False):
        return err
    return click.exceptions.Exit(err.exit_code)


def as_click(err: Exception, dist: Any) -> Exception | None:
    """What the command says of a failure of its run (None: not one of the run's; it goes on as it is)."""
    from runtime.spec import SpecError
    from training.checkpoint import CheckpointError
    from training.data import DataError
    from training.distributed import PeerFailedError
    from training.errors import OutOfMemory, QuietExit, RunError, RunStopped
    from training.errors import Restarting as RunRestarting
    from training.points.trainer import ConfigError
    from training.ranks import rank_prefix

    if isinstance(err, QuietExit):
        return click.exceptions.Exit(err.exit_code)
    if isinstance(err, RunStopped):
        return Interrupted(f"train: {err}")  # as every command names itself in its stop's line
    if isinstance(err, RunError):  # (out of memory: named as the command's other out-of-memory lines are, cli.main)
        said = f"train: {err}" if isinstance(err, OutOfMemory) else str(err)
        shown = (Restarting if isinstance(err, RunRestarting) else click.ClickException)(said)
        shown.exit_code, shown.this_rank = err.exit_code, err.this_rank
        return on_rank(dist, shown)
    if isinstance(err, DataError):  # the file exists (checked before) but its content is unusable: exit 1, no usage
        return on_rank(dist, click.ClickException(f"--data: {err}"))
    if isinstance(err, UsageError):
        return on_rank(dist, click.BadParameter(str(err), param_hint=f"'{err.param}'") if err.param
                       else click.UsageError(str(err)))
    if isinstance(err, (CheckpointError, ConfigError, SpecError, Seq2OnnxError)):
        return on_rank(dist, click.ClickException(str(err)))
    if isinstance(err, click.ClickException):
        return on_rank(dist, err)
    if isinstance(err, PeerFailedError):  # while rank 0 prepared the run, or before the first epoch
        prefix = "" if dist is None or dist.is_main else rank_prefix(dist)
        return click.ClickException(f"{prefix}{err}; nothing was written")
    return None
