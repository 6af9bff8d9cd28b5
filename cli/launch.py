"""`seq2onnx train --nproc-per-node N`: the same run on N processes, started by PyTorch's own launcher.

The command checks its options in one process (`cli.launch_options`), then hands the rest of its command line to
`torch.distributed.run` (what `torchrun` is) with `-m training`, the entry point every rank runs. So

    seq2onnx train --nproc-per-node 2 --data reverse --out ckpt
    torchrun --standalone --nproc-per-node 2 -m training --data reverse --out ckpt

do the same. Several machines: the same command on each, with `--nnodes`, and `--rdzv-endpoint` naming one of them
(c10d rendezvous). Only click and the stdlib at module level, so `--help` works without torch.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click

from runtime.atomic import identity

from .launch_options import DEFAULT_RDZV_TIMEOUT_S, LAUNCH_OPTIONS, RDZV_BACKEND
from .run_logs import torchrun_logs
from .signals import Interrupted, StoppedBySigterm, quiet_a_closed_terminal, stopped_by_sigterm
from .train_options import given

ENTRY_MODULE = "training"  # `python -m training` is `seq2onnx train`
CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"  # read once, when torch loads
ELASTIC_LOGGERS = "torch.distributed.elastic"


def quiet_launcher() -> bool:
    """Before torch loads in the launching process: its C++ warnings off (a lost rendezvous host prints each of
    them with dozens of stack frames, and the launcher reports the failure in a line of its own). True when this set
    the variable, which `launch` then removes so the ranks start with the user's settings."""
    if "torch" in sys.modules or CPP_LOG_ENV in os.environ:
        return False
    os.environ[CPP_LOG_ENV] = "ERROR"
    return True


def forwarded_args(ctx: click.Context) -> list[str]:
    """The options the user gave, launcher options left out, as each rank's command line."""
    args: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in LAUNCH_OPTIONS or not given(ctx, param.name):
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            if param.secondary_opts:
                args.append(param.opts[0] if value else param.secondary_opts[0])
            elif value:
                args.append(param.opts[0])
        else:
            args += [param.opts[0], str(value)]
    return args


def torchrun_args(launch: dict[str, Any], rank_args: list[str]) -> list[str]:
    """torch.distributed.run's command line: one machine standalone, several by a c10d rendezvous."""
    args = ["--nproc-per-node", str(launch["nproc_per_node"])]
    nodes = launch["nnodes"] or 1
    if nodes == 1:
        args.append("--standalone")
    else:
        args += ["--nnodes", str(nodes), "--rdzv-backend", RDZV_BACKEND, "--rdzv-endpoint", launch["rdzv_endpoint"]]
        if launch["rdzv_id"] is not None:
            args += ["--rdzv-id", launch["rdzv_id"]]
        if launch["rdzv_timeout"] is not None:
            args += ["--rdzv-conf", f"join_timeout={launch['rdzv_timeout']}"]
    if launch["max_restarts"]:
        args += ["--max-restarts", str(launch["max_restarts"])]
    return [*args, "-m", ENTRY_MODULE, *rank_args]


def launch(ctx: click.Context, launch: dict[str, Any], threads: int | None, out: Path, state_file: Path,
           extending: bool = False, quieted: bool = False) -> None:
    """Run every rank through torch.distributed.run and wait; a failed or interrupted run is one clear line that
    says what it left: `out` where rank 0 published it, else the state in `state_file`, else, where the run is
    `extending` the finished `out` (--resume), `out` as it was.
    `quieted`: `quiet_launcher` set the C++ log level of this process, not to be passed on to the ranks."""
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousError,
        RendezvousTimeoutError,
    )
    from torch.distributed.run import parse_args, run

    from runtime.sessions import max_threads

    if quieted:
        os.environ.pop(CPP_LOG_ENV, None)
    for name in list(logging.root.manager.loggerDict):  # its log narrates what the ranks and the final line say
        if name.startswith(ELASTIC_LOGGERS):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    per_rank = threads if threads is not None else max(1, max_threads() // launch["nproc_per_node"])
    os.environ.setdefault("OMP_NUM_THREADS", str(per_rank))  # what torchrun would set (to 1), said once, no warning
    nodes, endpoint, wait_s = launch["nnodes"] or 1, launch["rdzv_endpoint"], launch["rdzv_timeout"]
    wait_s = wait_s or DEFAULT_RDZV_TIMEOUT_S
    if nodes > 1:
        click.echo(f"waiting for {nodes} machines to join the rendezvous at {endpoint} (up to {wait_s} s; the same "
                   "command must run on each)", err=True)

    kept = functools.partial(_kept, out, identity(out), state_file, extending)  # read as the run stops

    def all_stopped() -> str:
        return f"every process of the run has stopped; {kept()}"

    with torchrun_logs() as logs:  # torchrun's own (its ranks' error files): removed however the run ends
        try:
            run(parse_args(["--log-dir", logs, *torchrun_args(launch, forwarded_args(ctx))]))
        except RendezvousTimeoutError:
            raise click.ClickException(f"not all {nodes} machines joined the rendezvous at {endpoint} within "
                                       f"{wait_s} s; start the same command on each (--rdzv-timeout waits longer); "
                                       f"{kept()}") from None
        except (RendezvousError, DistError) as err:  # the rendezvous host is unreachable, or went away
            raise click.ClickException(f"the rendezvous at {endpoint} failed: {_first_line(err)}; "
                                       f"{kept()}") from None
        except ChildFailedError as err:
            main = err.failures.get(0)
            if main is not None and all(f.exitcode > 0 for f in err.failures.values()):
                # Rank 0 ran here and said what went wrong (a usage or data error, a lost peer, and what was kept);
                # the other ranks ended with it. Its status is the run's, without a second message.
                raise click.exceptions.Exit(main.exitcode) from None
            rank, failure = _root_failure(err.failures)
            how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
                   else f"exited with status {failure.exitcode}")
            failed = click.ClickException(f"training failed: rank {rank} (pid {failure.pid}) {how}, and every "
                                          "process of the run has stopped (any message of theirs is above); "
                                          f"{kept()}")
            failed.exit_code = failure.exitcode if failure.exitcode == click.UsageError.exit_code else 1  # stays usage
            raise failed from None
        except SignalException as err:
            if err.sigval == signal.SIGHUP:  # torchrun's handler takes it, not ours: the terminal may be gone
                quiet_a_closed_terminal()
            sigterm = err.sigval in (signal.SIGTERM, signal.SIGHUP)  # a hang-up as our SIGHUP handler makes it
            raise _run_stopped(sigterm, all_stopped()) from None
        except KeyboardInterrupt:  # a SIGTERM that lands before torchrun's own handler is ours (Terminated)
            raise _run_stopped(stopped_by_sigterm(), all_stopped()) from None


def _run_stopped(sigterm: bool, kept: str) -> Interrupted:
    """The launcher's line for a run stopped by SIGTERM (exit 143) or Ctrl-C (130), saying what was `kept`."""
    return StoppedBySigterm(f"train: stopped by SIGTERM; {kept}") if sigterm else Interrupted(
        f"train: interrupted; {kept}")


def _root_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """(rank, failure) that stopped the run: a rank killed by a signal other than the SIGTERM torchrun sends the
    ranks it stops, else the earliest. torchrun's own choice, the earliest, reads whole-second timestamps: a rank
    that exited on its own right after a killed peer (having said so) ties with it, and wins by rank order."""
    killed = {rank: f for rank, f in failures.items() if f.exitcode < 0 and -f.exitcode != signal.SIGTERM}
    candidates = killed or failures
    rank = min(candidates, key=lambda r: (candidates[r].timestamp, r))
    return rank, candidates[rank]


def _first_line(err: BaseException) -> str:
    """The first line of an error and of what caused it, without C++ source locations."""
    lines = []
    while err is not None and len(lines) < 2:
        text = str(err).strip()
        if text and "See inner exception" not in text:
            lines.append(re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]))
        elif not text:
            lines.append(type(err).__name__)
        err = err.__cause__
    return " (".join(lines) + ")" * (len(lines) - 1)


def _kept(out: Path, before: tuple[int, int] | None, state_file: Path, extending: bool = False) -> str:
    """What a run that stopped left: `out`, where rank 0 published it (a new directory entry, not the one there
    `before`) once the last epoch was done, else the last saved state in `state_file`, else the finished `out` a
    --resume was `extending`, else nothing."""
    from training.errors import unchanged

    if identity(out) not in (None, before):
        return f"{str(out)!r} was written: the run is complete"
    if state_file.is_file():
        return (f"the last saved state is in {str(state_file)!r}; rerun with --resume to continue (with any number "
                "of processes)")
    return unchanged(out) if extending else "no training state was saved yet; rerun to start again"
