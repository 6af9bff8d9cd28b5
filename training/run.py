"""A training run, from checked options to a checkpoint directory: prepare (read the saved state on resume, refuse or
clear an interrupted run), build the kind's job, train with the resumable state saved as asked, write the
checkpoint, report. Under torchrun rank 0 prepares and alone writes, and the ranks leave together (`ranks`).

The command line supplies the options and how they become a job (`RunHooks`); what goes wrong is raised as the
types of `training.errors` and `runtime.errors.UsageError`, which it turns into its messages and exit statuses."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.atomic import identity
from runtime.contract import CHECKPOINT_STATE_FILE, partial_dir
from runtime.errors import UsageError, held_signals, out_of_memory
from runtime.writer_lock import exclusive

from .checkpoint import check_checkpoint_destination, save_checkpoint
from .distributed import RESTART_ENV, Dist, PeerFailedError
from .errors import OutOfMemory, RunError, RunStopped
from .ranks import (
    agree,
    check_same_command,
    distributed_meta,
    leave_together,
    local_processes,
    ran_out_of_memory,
    stopped_early,
    wait_for_the_checkpoint,
    why_stopped,
)
from .torchrun import env_count
from .train_state import check_state_of, clear_partial, find_resume_state, load_train_state, save_train_state


@dataclass
class Job:
    """One model kind's part of a run: its trainer, the data description, what to save beside the weights
    (vocabularies, extra resumable state), and what to print at the end."""

    trainer: Any
    description: dict[str, Any]
    report: Callable[[], None]
    vocabularies: tuple[Any, Any] | None = None
    extra_state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunPlan:
    """A run as the command line asked for it: `options` checked for `kind` (a resumed run's are read from its
    saved state instead); `command` is every option as given and `flags` their names, which the processes of a
    torchrun job compare."""

    out: Path
    kind: str
    options: dict[str, Any]
    save_every: int = 1
    resume: bool = False
    force: bool = False
    quiet: bool = False
    command: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunHooks:
    """What the command line supplies: a resumed run's options (the saved ones, with what may change), a kind's
    job, and where progress lines go."""

    resumed_options: Callable[[str, dict[str, Any]], dict[str, Any]]  # (kind, saved state) -> checked options
    job: Callable[[str, dict[str, Any], dict[str, Any] | None, Dist | None], Job]  # (kind, options, state, dist)
    say: Callable[[str], None]


def check_resumable(out: Path, resume: bool, force: bool) -> None:
    """Before any process starts: --resume needs a saved state, a new run must not overwrite an interrupted one."""
    if resume and find_resume_state(out) is None:
        raise _nothing_to_resume(out)
    if not resume and not force and (partial_dir(out) / CHECKPOINT_STATE_FILE).exists():
        raise _interrupted_run(partial_dir(out))


def _nothing_to_resume(out: Path) -> UsageError:
    return UsageError(f"nothing to resume: neither {partial_dir(out) / CHECKPOINT_STATE_FILE} nor "
                      f"{out / CHECKPOINT_STATE_FILE} exists; run without --resume to start", param="--resume")


def _interrupted_run(partial: Path) -> RunError:
    return RunError(f"an interrupted run is saved in {str(partial)!r}; pass --resume to continue it or --force to "
                    "discard it and start over")


def run(plan: RunPlan, hooks: RunHooks, dist: Dist | None = None) -> None:
    """Train and write the checkpoint; under torchrun rank 0 prepares the run (and alone writes), the others
    receive what it prepared."""
    out = plan.out
    if dist is not None:
        check_same_command(plan.command, plan.flags, dist)
    with ExitStack() as held:
        def prepare() -> tuple[dict[str, Any], str, dict[str, Any] | None]:
            check_checkpoint_destination(out, force=plan.force or plan.resume)  # protected paths: before any lock
            if plan.resume and find_resume_state(out) is None:  # before the lock, which would make out's parents
                raise _nothing_to_resume(out)
            held.enter_context(exclusive(out))  # one writer per --out for the whole run, its .partial state included
            return _setup(plan, hooks, dist)

        opts, kind, state = agree(dist, prepare)
        other_machine = dist is not None and not dist.is_main and dist.local_rank == 0
        if other_machine:
            last = dist.rank + local_processes() - 1
            ranks = f"rank {dist.rank}" if last == dist.rank else f"ranks {dist.rank}-{last}"
            hooks.say(f"this machine runs {ranks} of {dist.world_size}; rank 0 shows the progress and writes "
                      f"{str(out)!r} on its machine")
        saved_state = partial_dir(out) / CHECKPOINT_STATE_FILE  # (out is checked now: it has a name)
        job = hooks.job(kind, opts, state, dist)
        job.extra_state["world_size"] = 1 if dist is None else dist.world_size
        if state is not None:
            job.trainer.load_state_dict(state)
        extending = out if state is not None and not saved_state.exists() else None  # a finished run's state
        _fit(job, saved_state, plan.save_every, plan.quiet, dist, extending)
        if dist is not None and not dist.is_main:
            wait_for_the_checkpoint(dist)  # leaving first, a rank could end the run while rank 0 writes
            leave_together(dist, out)
            if other_machine:
                hooks.say(f"training finished on this machine; rank 0 wrote {str(out)!r} on its machine")
            return
        _write(plan, job, saved_state, dist)
    hooks.say(f"checkpoint written to {out}")
    try:
        if dist is not None:
            leave_together(dist, out)  # the report needs no other rank
        job.report()
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM's Terminated
        raise RunStopped(f"{why_stopped(err, dist)} after {str(out)!r} was written; only the accuracy report was "
                         "skipped") from None


def _write(plan: RunPlan, job: Job, saved_state: Path, dist: Dist | None) -> None:
    """Rank 0 (or the only process): the checkpoint from the trained state, then the interrupted run's state gone."""
    trainer = job.trainer
    before = identity(Path(plan.out))
    try:
        save_checkpoint(plan.out, trainer.model, trainer.spec, trainer.config, trainer.history, job.description,
                        {**trainer.state_dict(), **job.extra_state}, force=plan.force or plan.resume,
                        vocabularies=job.vocabularies, meta=distributed_meta(trainer.config, dist))
    except KeyboardInterrupt as err:
        if identity(Path(plan.out)) not in (None, before):  # it landed once the checkpoint was in place
            clear_partial(plan.out)
            raise RunStopped(f"{why_stopped(err, dist)} just after {str(plan.out)!r} was written; the run is "
                             "complete") from None
        raise RunStopped(f"{why_stopped(err, dist)} while writing the checkpoint after the last epoch; "
                         f"{str(plan.out)!r} was not written, the trained state is in {str(saved_state)!r}: rerun "
                         "with --resume to write it") from None
    except (MemoryError, RuntimeError, OSError, ImportError) as err:  # (matplotlib's import for loss.png, say)
        if not out_of_memory(err) or identity(Path(plan.out)) not in (None, before):
            raise
        del err
        raise OutOfMemory(f"out of memory while writing the checkpoint after the last epoch; under a memory limit "
                          f"(ulimit -v), raise it; {str(plan.out)!r} was not written, the trained state is in "
                          f"{str(saved_state)!r}: rerun with --resume to write it") from None
    clear_partial(plan.out)
    if dist is not None:
        dist.broadcast(True)  # the checkpoint is written: the other ranks may leave


def _setup(plan: RunPlan, hooks: RunHooks, dist: Dist | None) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """(options, model kind, saved state or None): the saved state read and checked on --resume, else a stale
    interrupted run refused (or, with --force, cleared)."""
    out, resume, partial = plan.out, plan.resume, partial_dir(plan.out)
    restart = env_count(RESTART_ENV)
    if not resume and restart > 0 and (partial / CHECKPOINT_STATE_FILE).is_file():
        hooks.say(f"torchrun started the processes again (restart {restart}): resuming from the last saved state")
        resume = True
    if not resume:
        if not plan.force and (partial / CHECKPOINT_STATE_FILE).exists():
            raise _interrupted_run(partial)
        clear_partial(out)
        return plan.options, plan.kind, None
    state_file = find_resume_state(out)
    if state_file is None:
        raise _nothing_to_resume(out)
    state, finished = load_train_state(state_file), state_file.parent != partial
    if finished:
        check_state_of(out, state_file, state)
    kind = "tokens" if state["spec"].get("kind") == "tokens" else "points"
    opts = hooks.resumed_options(kind, state)
    _check_resumed_epochs(out, state, opts["epochs"], finished=finished)
    world_size, saved_size = 1 if dist is None else dist.world_size, int(state.get("world_size", 1))
    if world_size != saved_size:
        batch = opts["batch_size"]
        hooks.say(f"resuming a run saved by {saved_size} process(es) on {world_size}: the global batch goes from "
                  f"{batch * saved_size} to {batch * world_size} (--batch-size {batch} per process); the learning "
                  "rate stays as it was")
    return opts, kind, state


def _check_resumed_epochs(out: Path, state: dict[str, Any], epochs: int, finished: bool) -> None:
    """A finished run extends to more epochs than it has; an interrupted one to at least its saved epoch."""
    if finished and state["epoch"] >= epochs:
        raise UsageError(f"{str(out)!r} is already trained for {state['epoch']} epochs; pass --epochs "
                         f"{state['epoch'] + 1} or more to continue it", param="--epochs")
    if state["epoch"] > epochs:
        raise UsageError(f"the saved state is at epoch {state['epoch']}, past --epochs {epochs}; pass --epochs "
                         f"{state['epoch']} or more", param="--epochs")


def _fit(job: Job, state_file: Path, save_every: int, quiet: bool, dist: Dist | None,
         extending: Path | None = None) -> None:
    """Train to the configured epochs, saving the resumable state as asked (rank 0 only); Ctrl-C, SIGTERM and the
    loss of another rank under torchrun stop it with one line saying what was kept (`extending`: the finished
    checkpoint a --resume continues, as it was until a state is saved)."""
    main = dist is None or dist.is_main
    saved = [job.trainer.epoch if state_file.exists() else None]  # the epoch the state file holds (a resumed run's)

    def save_state(t: Any) -> None:
        if main and (t.epoch % save_every == 0 or t.epoch == t.config.epochs):
            # a stop during the save lands once it is written (it cut the save: the epoch just trained was lost,
            # and the line said a state two epochs back)
            with held_signals():
                save_train_state(state_file, {**t.state_dict(), **job.extra_state}, job.description)
                saved[0] = t.epoch

    try:
        job.trainer.fit(save_state, progress=not quiet)
    except (KeyboardInterrupt, PeerFailedError) as err:
        raise stopped_early(err, job.trainer.epoch + 1, state_file, dist, job.trainer.config.epochs,
                            saved[0], extending) from None
    except (MemoryError, RuntimeError) as err:  # (cli.main would say only that it ran out: not what it kept)
        if not out_of_memory(err):
            raise
        del err  # its frames hold the epoch's tensors
        raise ran_out_of_memory(job.trainer.epoch + 1, state_file, dist, saved[0], extending) from None
