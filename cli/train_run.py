"""What `seq2onnx train` does once its options are checked: prepare the run (read a saved state on --resume, refuse
or clear an interrupted one), build the job, train, and write the checkpoint (rank 0 under torchrun; what the other
ranks add is in `cli.train_ranks`)."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from runtime.contract import CHECKPOINT_STATE_FILE

from .common import Interrupted
from .train_options import POINTS, TOKENS, Job, data_kind, prepare_options
from .train_points import point_job, saved_point_options
from .train_ranks import (
    agree,
    check_same_command,
    distributed_meta,
    leave_together,
    local_processes,
    stopped_early,
    wait_for_the_checkpoint,
    why_stopped,
)
from .train_tokens import saved_token_options, token_job


@dataclass(frozen=True)
class TrainKind:
    """One model kind's part of `train`: its Job (data, trainer, report), and the options a saved run was started
    with."""

    job: Callable[[click.Context, dict[str, Any], dict[str, Any] | None, Any], Job]
    saved_options: Callable[[dict[str, Any]], dict[str, Any]]


# The one place the data's (or a resumed run's) kind picks what `train` builds.
KINDS = {POINTS: TrainKind(point_job, saved_point_options), TOKENS: TrainKind(token_job, saved_token_options)}


def check_resumable(ctx: click.Context, out: Path, resume: bool, force: bool) -> None:
    """Before any process starts: --resume needs a saved state, a new run must not overwrite an interrupted one."""
    from training.checkpoint import find_resume_state, partial_dir

    if resume and find_resume_state(out) is None:
        raise _nothing_to_resume(ctx, out)
    if not resume and not force and (partial_dir(out) / CHECKPOINT_STATE_FILE).exists():
        raise _interrupted_run(partial_dir(out))


def _nothing_to_resume(ctx: click.Context, out: Path) -> click.BadParameter:
    from training.checkpoint import partial_dir

    return click.BadParameter(f"nothing to resume: neither {partial_dir(out) / CHECKPOINT_STATE_FILE} nor "
                              f"{out / CHECKPOINT_STATE_FILE} exists; run without --resume to start",
                              ctx=ctx, param_hint="'--resume'")


def _interrupted_run(partial: Path) -> click.ClickException:
    return click.ClickException(f"an interrupted run is saved in {str(partial)!r}; pass --resume to continue it or "
                                "--force to discard it and start over")


def run_training(ctx: click.Context, opts: dict[str, Any], out: Path, save_every: int, resume: bool, force: bool,
         quiet: bool, dist: Any) -> None:
    """Train and write the checkpoint; under torchrun rank 0 prepares the run (and alone writes), the others
    receive what it prepared."""
    from contextlib import ExitStack

    from runtime.atomic import exclusive
    from training.checkpoint import (
        check_checkpoint_destination,
        clear_partial,
        partial_dir,
        save_checkpoint,
    )

    if dist is not None:
        check_same_command(ctx, dist)
    with ExitStack() as held:
        def prepare() -> tuple[dict[str, Any], str, dict[str, Any] | None]:
            check_checkpoint_destination(out, force=force or resume)  # protected paths: refused before any lock
            held.enter_context(exclusive(out))  # one writer per --out for the whole run, its .partial state included
            return _setup(ctx, opts, out, resume, force, dist)

        opts, kind, state = agree(dist, prepare)
        other_machine = dist is not None and not dist.is_main and dist.local_rank == 0
        if other_machine:
            last = dist.rank + local_processes() - 1
            ranks = f"rank {dist.rank}" if last == dist.rank else f"ranks {dist.rank}-{last}"
            click.echo(f"this machine runs {ranks} of {dist.world_size}; rank 0 shows the progress and writes "
                       f"{str(out)!r} on its machine")
        saved_state = partial_dir(out) / CHECKPOINT_STATE_FILE  # (out is checked now: it has a name)
        job = KINDS[kind].job(ctx, opts, state, dist)
        job.extra_state["world_size"] = 1 if dist is None else dist.world_size
        trainer = job.trainer
        if state is not None:
            trainer.load_state_dict(state)
        _fit(job, saved_state, save_every, quiet, dist)
        if dist is not None and not dist.is_main:
            wait_for_the_checkpoint(dist)  # leaving first, a rank could end the run while rank 0 writes
            leave_together(dist, out)
            if other_machine:
                click.echo(f"training finished on this machine; rank 0 wrote {str(out)!r} on its machine")
            return
        try:
            save_checkpoint(out, trainer.model, trainer.spec, trainer.config, trainer.history, job.description,
                            {**trainer.state_dict(), **job.extra_state}, force=force or resume,
                            vocabularies=job.vocabularies, meta=distributed_meta(trainer.config, dist))
        except KeyboardInterrupt as err:
            raise Interrupted(f"{why_stopped(err, dist)} while writing the checkpoint after the last epoch; "
                              f"{str(out)!r} was not written, the trained state is in {str(saved_state)!r}: rerun "
                              "with --resume to write it") from None
        clear_partial(out)
        if dist is not None:
            dist.broadcast(True)  # the checkpoint is written: the other ranks may leave
    click.echo(f"checkpoint written to {out}")
    try:
        if dist is not None:
            leave_together(dist, out)  # the report needs no other rank
        job.report()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {str(out)!r} was written; only the accuracy report was "
                          "skipped") from None


def _setup(ctx: click.Context, opts: dict[str, Any], out: Path, resume: bool, force: bool,
           dist: Any) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """(options, model kind, saved state or None): the saved state read and checked on --resume, else a stale
    interrupted run refused (or, with --force, cleared)."""
    from training.checkpoint import (
        clear_partial,
        find_resume_state,
        load_train_state,
        partial_dir,
    )

    partial = partial_dir(out)
    from training.distributed import RESTART_ENV

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
    opts = prepare_options(ctx, opts, kind, KINDS[kind].saved_options(state))
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


def _fit(job: Job, state_file: Path, save_every: int, quiet: bool, dist: Any) -> None:
    """Train to the configured epochs, saving the resumable state as asked (rank 0 only); Ctrl-C is exit 130 saying
    what was kept, and so are SIGTERM and the loss of another rank under torchrun."""
    from training.checkpoint import save_train_state
    from training.distributed import PeerFailedError

    main = dist is None or dist.is_main

    def save_state(t: Any) -> None:
        if main and (t.epoch % save_every == 0 or t.epoch == t.config.epochs):
            save_train_state(state_file, {**t.state_dict(), **job.extra_state}, job.description)

    try:
        job.trainer.fit(save_state, progress=not quiet)
    except (KeyboardInterrupt, PeerFailedError) as err:
        raise stopped_early(err, job.trainer.epoch + 1, state_file, dist) from None

