"""What a run on several processes (torchrun) adds to a training run: one message per run, not per process; rank 0
prepares and the others receive; every process must run the same command; the ranks wait for the checkpoint and
leave together; and the one-line messages of a run that stops early (Ctrl-C, SIGTERM, a lost peer, a restart)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from runtime.errors import UsageError

from .distributed import BACKEND, RESTART_ENV, Dist, PeerFailedError, Terminated, leave
from .errors import OutOfMemory, QuietExit, Restarting, RunError, RunStopped, ignore_further_interrupts, unchanged
from .torchrun import env_count

PER_MACHINE_OPTIONS = ("threads", "quiet")  # may differ between the machines of one run
LAUNCHER_EXIT_S = 0.5  # how long a SIGTERMed rank looks for its launcher's death (a killed one's takes milliseconds)
USAGE_STATUS = 2  # the exit status of a usage mistake
T = TypeVar("T")


def rank_prefix(dist: Dist) -> str:
    return f"rank {dist.rank}: "


def local_processes() -> int:
    """The processes torchrun started on this machine."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def exit_status(err: BaseException) -> int:
    """The status a failure ends the command with: 2 for a usage mistake, else its own or 1."""
    return USAGE_STATUS if isinstance(err, UsageError) else int(getattr(err, "exit_code", 1))


def wait_for_the_checkpoint(dist: Dist) -> None:
    """A rank other than 0, after the last epoch: wait until rank 0 has written the checkpoint."""
    try:
        dist.broadcast(None)
    except PeerFailedError as err:
        raise RunError(f"{rank_prefix(dist)}{err} after the last epoch, while rank 0 wrote the checkpoint",
                       this_rank=True) from None


def leave_together(dist: Dist, out: Path) -> None:
    """Every rank, once the checkpoint is written: leave the job with the others (`distributed.leave`)."""
    try:
        leave(dist)
    except PeerFailedError as err:
        prefix = "" if dist.is_main else rank_prefix(dist)
        raise RunError(f"{prefix}{err}, after {str(out)!r} was written", this_rank=True) from None


def check_same_command(command: dict[str, Any], flags: dict[str, str], dist: Dist) -> None:
    """Every process runs the same command (`command`: its options but PER_MACHINE_OPTIONS; `flags`: each option's
    flag): machines started with different options would otherwise train silently with rank 0's. Said once per
    machine, by its first process."""
    mine = {name: value for name, value in command.items() if name not in PER_MACHINE_OPTIONS}
    mine["nproc_per_node"] = local_processes()  # as torchrun started them, whichever launcher it was
    everyone = dist.gather(mine)
    differ = [(rank, name) for rank, theirs in enumerate(everyone) for name in mine
              if theirs.get(name) != everyone[0].get(name)]
    if not differ:
        return
    if dist.local_rank != 0:
        raise QuietExit(USAGE_STATUS)
    rank, name = differ[0]
    theirs, main = everyone[rank][name], everyone[0][name]
    raise RunError(f"{'' if dist.is_main else rank_prefix(dist)}the processes of this run were started with "
                   f"different options: {flags.get(name, name)} is {_shown(theirs)} on rank {rank} but {_shown(main)} "
                   "on rank 0; run the same command on every machine; nothing was written",
                   exit_code=USAGE_STATUS, this_rank=True)  # a usage mistake, as on one machine; one line a machine


def _shown(value: Any) -> str:
    return "not given" if value is None else repr(str(value) if isinstance(value, Path) else value)


def agree(dist: Dist | None, prepare: Callable[[], T]) -> T:
    """`prepare()` on rank 0 (or the only process), its result on every rank. When it fails on rank 0, the error is
    raised there and the other ranks leave with the same status (2: a usage error) without a message of their own."""
    if dist is None:
        return prepare()
    if dist.is_main:
        try:
            agreed = prepare()
        except BaseException as err:
            try:
                dist.broadcast(exit_status(err))
            except PeerFailedError:
                pass  # the others are gone already; the error at hand is the one to report
            raise
        return dist.broadcast(agreed)
    agreed = dist.broadcast(None)
    if isinstance(agreed, int):
        raise QuietExit(agreed)
    return agreed


def distributed_meta(config: Any, dist: Dist | None) -> dict[str, Any] | None:
    """spec.json's record of a torchrun run: processes, the per-process and the global batch."""
    if dist is None:
        return None
    return {"distributed": {"world_size": dist.world_size, "backend": BACKEND, "batch_size_per_process":
                            config.batch_size, "global_batch_size": config.batch_size * dist.world_size}}


def _restarts_left() -> int:
    """How often torchrun will still start the processes again after a failure (--max-restarts)."""
    return max(0, env_count("TORCHELASTIC_MAX_RESTARTS") - env_count(RESTART_ENV))


def why_stopped(err: BaseException, dist: Dist | None = None) -> str:
    """Why a run stopped early, in a few words."""
    if isinstance(err, PeerFailedError):
        return str(err)
    if isinstance(err, Terminated):
        if dist is not None and dist.launcher_died(within=LAUNCHER_EXIT_S):
            return f"stopped: its launcher (pid {dist.launcher}) died"
        if dist is None:
            return "stopped by SIGTERM"
        return "stopped by SIGTERM (torchrun stops every process when one of them fails or it is interrupted)"
    return "interrupted"


def stopped_early(err: BaseException, epoch: int, state_file: Path, dist: Dist | None,
                  epochs: int | None = None, saved: int | None = None, extending: Path | None = None) -> Exception:
    """One line for a run that stopped early: why, in which epoch (or after the last of `epochs`), and what was kept
    (the state of epoch `saved`, where known: with --save-every the epochs after it are lost; else the finished
    checkpoint a --resume is `extending`). Under torchrun, a rank other than 0 says it only for a lost peer (which
    rank saw what); stopped by the user, it leaves quietly."""
    if dist is not None and not dist.is_main and not isinstance(err, PeerFailedError):
        ignore_further_interrupts()
        return QuietExit(RunStopped.exit_code)
    why = why_stopped(err, dist)  # (first: it waits a moment to tell a dead launcher from torchrun's stop)
    of = f" (of epoch {saved})" if saved is not None and state_file.exists() else ""
    hint = what_was_kept(state_file, saved, extending)
    left = 0 if dist is None or dist.launcher_died() else _restarts_left()
    restarting = left > 0 and isinstance(err, PeerFailedError)  # torchrun restarts after a failure, not a stop
    if restarting:
        kept = (f"from the last saved state{of} in {str(state_file)!r}" if state_file.exists()
                else f"from {str(extending)!r}" if extending is not None else "from the start")
        hint = f"torchrun starts the processes again ({left} restart(s) left) and they continue {kept}"
    elif left and isinstance(err, Terminated):
        hint = f"unless torchrun starts the processes again ({left} restart(s) left; it does after a failure), {hint}"
    when = f"after the last epoch ({epochs})" if epochs is not None and epoch > epochs else f"during epoch {epoch}"
    message = f"{why} {when}; {hint}"
    if dist is not None and not dist.is_main:  # rank 0 says what was kept
        message = f"{rank_prefix(dist)}{why} {when}"
    if not isinstance(err, PeerFailedError):
        return RunStopped(message)  # (from here on a second Ctrl-C is ignored)
    return Restarting(message) if restarting else RunError(message, this_rank=True)  # this rank's own news


def what_was_kept(state_file: Path, saved: int | None, extending: Path | None) -> str:
    """What a run that ended early leaves to go on from, and how: the state of epoch `saved` in `state_file`, else
    the finished checkpoint a --resume is `extending`, else nothing."""
    if state_file.exists():
        of = f" (of epoch {saved})" if saved is not None else ""
        return f"the last saved state{of} is in {str(state_file)!r}; rerun with --resume to continue"
    return unchanged(extending) if extending is not None else "no training state was saved yet; rerun to start again"


def ran_out_of_memory(epoch: int, state_file: Path, dist: Dist | None, saved: int | None,
                      extending: Path | None) -> OutOfMemory:
    """One line for a run that found no memory during `epoch` (a MemoryError, torch's refused allocation): that,
    the advice, and what was kept, which a --resume continues once there is room. Every rank says its own."""
    prefix = "" if dist is None else rank_prefix(dist)
    return OutOfMemory(f"{prefix}out of memory during epoch {epoch}; under a memory limit (ulimit -v), raise it; "
                       f"{what_was_kept(state_file, saved, extending)}")
