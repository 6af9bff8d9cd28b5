"""What a run on several processes (torchrun) adds to `seq2onnx train`: one message per run, not per process; rank
0 prepares and the others receive; every process must run the same command; the ranks wait for the checkpoint and
leave together; and the one-line messages of a run that stops early (Ctrl-C, SIGTERM, a lost peer, a restart)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from .common import Interrupted


def on_rank(dist: Any, err: click.ClickException) -> click.ClickException | click.exceptions.Exit:
    """A user error as rank 0 reports it; the other ranks, which meet the same error, exit quietly with its
    status (one message per run, not one per process)."""
    if dist is None or dist.is_main or isinstance(err, Interrupted) or getattr(err, "this_rank", False):
        return err
    return click.exceptions.Exit(err.exit_code)


def rank_prefix(dist: Any) -> str:
    return f"rank {dist.rank}: "


def wait_for_the_checkpoint(dist: Any) -> None:
    """A rank other than 0, after the last epoch: wait until rank 0 has written the checkpoint."""
    from training.distributed import PeerFailedError

    try:
        dist.broadcast(None)
    except PeerFailedError as err:
        stopped = click.ClickException(f"{rank_prefix(dist)}{err} after the last epoch, while rank 0 wrote the "
                                       "checkpoint")
        stopped.this_rank = True
        raise stopped from None


def leave_together(dist: Any, out: Path) -> None:
    """Every rank, once the checkpoint is written: leave the job with the others (`distributed.leave`)."""
    from training.distributed import PeerFailedError, leave

    try:
        leave(dist)
    except PeerFailedError as err:
        prefix = "" if dist.is_main else rank_prefix(dist)
        stopped = click.ClickException(f"{prefix}{err}, after {str(out)!r} was written")
        stopped.this_rank = True
        raise stopped from None


PER_MACHINE_OPTIONS = ("threads", "quiet")  # may differ between the machines of one run


def check_same_command(ctx: click.Context, dist: Any) -> None:
    """Every process runs the same command (but for PER_MACHINE_OPTIONS): machines started with different
    options would otherwise train silently with rank 0's. Said once per machine, by its first process."""
    mine = {name: value for name, value in ctx.params.items() if name not in PER_MACHINE_OPTIONS}
    mine["nproc_per_node"] = local_processes()  # as torchrun started them, whichever launcher it was
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
        f"{'' if dist.is_main else rank_prefix(dist)}the processes of this run were started with different "
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


def local_processes() -> int:
    """The processes torchrun started on this machine."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def agree(dist: Any, prepare: Any) -> Any:
    """`prepare()` on rank 0 (or the only process), its result on every rank. When it fails on rank 0, the error is
    raised there and the other ranks exit with the same status (2: a usage error) without a message of their own."""
    if dist is None:
        return prepare()
    from training.distributed import PeerFailedError

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


def distributed_meta(config: Any, dist: Any) -> dict[str, Any] | None:
    """spec.json's record of a torchrun run: processes, the per-process and the global batch."""
    if dist is None:
        return None
    from training.distributed import BACKEND

    return {"distributed": {"world_size": dist.world_size, "backend": BACKEND, "batch_size_per_process":
                            config.batch_size, "global_batch_size": config.batch_size * dist.world_size}}


def _restarts_left() -> int:
    """How often torchrun will still start the processes again after a failure (--max-restarts)."""
    from training.distributed import RESTART_ENV

    return max(0, int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(os.environ.get(RESTART_ENV, "0")))


LAUNCHER_EXIT_S = 0.5  # how long a SIGTERMed rank looks for its launcher's death (a killed one's takes milliseconds)


class _Restarting(click.ClickException):
    """A lost peer while torchrun has restarts left: news (it starts the processes again), not an error."""

    def show(self, file: Any = None) -> None:
        click.echo(self.format_message(), err=True)


def why_stopped(err: BaseException, dist: Any = None) -> str:
    """Why a run stopped early, in a few words."""
    from training.distributed import PeerFailedError, Terminated

    if isinstance(err, PeerFailedError):
        return str(err)
    if isinstance(err, Terminated):
        if dist is not None and dist.launcher_died(within=LAUNCHER_EXIT_S):
            return f"stopped: its launcher (pid {dist.launcher}) died"
        return "stopped by SIGTERM (torchrun stops every process when one of them fails or it is interrupted)"
    return "interrupted"


def stopped_early(err: BaseException, epoch: int, state_file: Path, dist: Any) -> BaseException:
    """One line for a run that stopped early: why, in which epoch, and what was kept. Under torchrun, a rank other
    than 0 says it only for a lost peer (which rank saw what); stopped by the user, it exits quietly."""
    from training.distributed import PeerFailedError, Terminated

    if dist is not None and not dist.is_main and not isinstance(err, PeerFailedError):
        return click.exceptions.Exit(Interrupted("").exit_code)  # (Interrupted: from here on Ctrl-C is ignored)
    why = why_stopped(err, dist)  # (first: it waits a moment to tell a dead launcher from torchrun's stop)
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
        message = f"{rank_prefix(dist)}{why} during epoch {epoch}"
    if isinstance(err, PeerFailedError):
        stopped: click.ClickException = (_Restarting if restarting else click.ClickException)(message)
    else:
        stopped = Interrupted(message)  # (from here on a second Ctrl-C is ignored)
    stopped.this_rank = True  # this rank's own news: printed on every rank (see on_rank)
    return stopped
