"""Training on N processes under torchrun: DistributedDataParallel over gloo, one process per rank.

What each rank does, and why:
- every rank loads the whole data set and builds the same model; DDP broadcasts rank 0's weights at wrap time and
  averages gradients in backward, so parameters stay identical on every rank after every step;
- a rank trains on its shard of each epoch: `DistributedSampler(shuffle=True, seed, drop_last=False)` with
  `set_epoch(epoch)`, so the order depends on (seed, epoch, world size) only and a resumed run, with any world size,
  continues where it stopped; the sampler pads the shards to equal length so every rank takes as many steps;
- a step's loss is a sum over the rank's items (target tokens, or point coordinates) divided by the item count of
  the whole step, summed across ranks; times the world size, because DDP averages gradients over ranks. The
  gradient is then exactly that of one process on the combined batch, however padding falls among the ranks;
- the losses and validation counts the progress bar and the history show are all-reduced, so rank 0 reports the
  global figures; only rank 0 writes anything.

Training runs on CPUs here, so the backend is gloo (nccl needs CUDA tensors), with one worker thread; and a run
ends with `leave`, where the ranks meet before the process group goes (why both: `training.gloo`).
"""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.utils.data import DistributedSampler

from runtime.errors import Terminated  # SIGTERM, raised as a KeyboardInterrupt (torchrun's stop of every rank)

from .gloo import GLOO_ONE_WORKER, register_gloo_one_worker

BACKEND = "gloo"  # the transport, as spec.json records it
# How long a collective waits for a rank that is alive but silent (a dead one is noticed at once: its sockets
# close). Rank 0 saves the training state between collectives, so this must exceed the slowest save.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun for the processes it starts
PR_SET_PDEATHSIG = 1  # linux/prctl.h
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun: how often it has started the processes again
# How long `leave` waits for the other ranks: a rank-0-only step at the end of a run (a save, a report) fits;
# a dead rank is noticed at once (its sockets close), a stuck one is named when this runs out.
LEAVE_TIMEOUT = timedelta(minutes=5)
LEAVE_POLL_S = 0.05  # while meeting, the main thread wakes this often, so SIGTERM and Ctrl-C still land
RENDEZVOUS_POLL_S = 0.2  # the same, while the rendezvous and the connection wait for the peers on a thread
LEFT_KEY = "left"  # store key `left/<rank>`: this rank has come to `leave`
# Words in the errors gloo raises when a peer's connection breaks.
TRANSPORT_ERRORS = ("gloo", "Connection", "connection", "peer")


class PeerFailedError(RuntimeError):
    """A collective failed because another rank of the run stopped (killed, crashed, or interrupted)."""


def _first_line(err: Exception) -> str:
    """The first line of a gloo/c10d error, without gloo's source location and advice."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    first = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", first)
    return first.split(". This is typically")[0][:200]


def _peer_failed(err: RuntimeError) -> PeerFailedError | RuntimeError:
    """A transport error as PeerFailedError (its first line); anything else unchanged. From a PeerFailedError on,
    SIGTERM is ignored: torchrun stops this rank too as it sees the other's death, and its SIGTERM landing while
    this rank says why it stops replaced that message with a bare "interrupted" (seen once in CI)."""
    if isinstance(err, getattr(torch_dist, "DistError", ())) or any(w in str(err) for w in TRANSPORT_ERRORS):
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # on its way out, as `stop` makes it
        return PeerFailedError(f"another process of the run stopped ({_first_line(err)})")
    return err


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun job, and the few collectives training needs."""

    rank: int
    world_size: int
    local_rank: int
    launcher: int = 0  # the parent process at start (torchrun's agent): its pid
    store: Any = field(default=None, compare=False, repr=False)  # the job's key-value store (this attempt's keys)

    def launcher_died(self, within: float = 0.0) -> bool:
        """The process that started this one is gone: this one was handed to another parent, now or `within`
        seconds. (Linux sends the parent-death signal when the launcher's thread that started this process
        exits, which can be a moment before its last thread does and this process changes parents.)"""
        deadline = time.monotonic() + within
        while True:
            if self.launcher > 0 and os.getppid() != self.launcher:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reads resume state, shows progress and writes files."""
        return self.rank == 0

    def talk(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, a call in which this rank talks to the others: a collective, the DDP-wrapped module's
        forward (which broadcasts rank 0's buffers) or the loss's backward (which averages gradients)."""
        try:
            return call(*args)
        except RuntimeError as err:
            raise _peer_failed(err) from None

    def all_sum(self, *values: float) -> list[float]:
        """Each value summed over all ranks (float64)."""
        total = torch.tensor(values, dtype=torch.float64)  # (K,)
        self.talk(torch_dist.all_reduce, total)
        return total.tolist()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (pickled), in rank order, on every rank."""
        values: list[Any] = [None] * self.world_size
        self.talk(torch_dist.all_gather_object, values, value)
        return values

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (pickled; other ranks pass anything)."""
        box = [value]
        self.talk(torch_dist.broadcast_object_list, box, 0)  # (src=0)
        return box[0]

    def shard(self, n: int, seed: int, epoch: int) -> torch.Tensor:
        """This rank's row indices for `epoch`: DistributedSampler's shuffled share of range(n), padded so every
        rank gets ceil(n / world_size) rows."""
        sampler = DistributedSampler(range(n), num_replicas=self.world_size, rank=self.rank, shuffle=True,
                                     seed=seed, drop_last=False)
        sampler.set_epoch(epoch)
        return torch.tensor(list(sampler), dtype=torch.long)  # (ceil(n / W),)

    def rows(self, n: int) -> range:
        """This rank's share of n validation rows (strided, no padding: each row counted once)."""
        return range(self.rank, n, self.world_size)

    def wrap(self, module: nn.Module, find_unused: bool = False) -> nn.Module:
        """`module` under DistributedDataParallel (CPU: no device ids). `find_unused`: the module has parameters
        its forward never uses (DDP then looks for them after each forward instead of waiting for their
        gradients; those stay None, as in one process)."""
        return nn.parallel.DistributedDataParallel(module, find_unused_parameters=find_unused)


def _die_with_launcher() -> None:
    """Under torchrun: SIGTERM when the launcher dies. torchrun stops its ranks when it is interrupted, but a
    launcher killed outright (SIGKILL, the OOM killer) cannot, and ranks in sessions of their own would train on
    as orphans, holding the checkpoint's lock. Linux only (prctl); elsewhere nothing changes."""
    if TORCHRUN_ENV not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _waited_for(call: Callable[[], Any], name: str) -> Any:
    """`call()` on a thread of its own while this (the main) thread waits for it, and its result or error.

    Why: torch's waits for the other ranks (the store connection, and gloo's full mesh, which waits in the store
    for each peer's address) poll in C++ without returning to Python, and Python runs signal handlers on the main
    thread only. A rank waiting there took neither SIGTERM nor Ctrl-C: for up to 30 minutes where it was started by
    hand, and under torchrun for the 30 s torchrun gives a rank to stop before killing it, where Ctrl-C came while
    its peer, not yet connected, stopped at once. Here they land as they would anywhere else; the thread, a daemon,
    is left."""
    found: list[Any] = []

    def run() -> None:
        try:
            found.append(call())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            found.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(RENDEZVOUS_POLL_S)
    if isinstance(found[0], BaseException):
        raise found[0]
    return found[0]


def _rendezvous() -> tuple[Any, int, int]:
    """torch's env:// rendezvous: (store, rank, world size)."""
    return _waited_for(lambda: next(torch_dist.rendezvous("env://", timeout=COLLECTIVE_TIMEOUT)),
                       "seq2onnx-rendezvous")


def start() -> Dist:
    """Join the torchrun job this process belongs to (gloo); SIGTERM raises `Terminated` from here on."""
    launcher = os.getppid()
    _die_with_launcher()
    alone = os.environ.get("WORLD_SIZE") == "1"  # a run of one process waits for no one
    if TORCHRUN_ENV not in os.environ and not alone:  # started by hand or by another launcher: the wait would be silent
        print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: waiting for the other processes at "
              f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} (up to "
              f"{COLLECTIVE_TIMEOUT.total_seconds() / 60:g} min)", file=sys.stderr, flush=True)
    # The store is torchrun's; after a restart (--max-restarts) it still holds the last attempt's keys, and a
    # rank reading the old rank 0's address before the new one writes it would connect to a dead port. A prefix
    # per attempt keeps each attempt to its own keys.
    store, rank, world_size = _rendezvous()
    attempt = os.environ.get(RESTART_ENV, "0")
    store = torch_dist.PrefixStore(f"seq2onnx/attempt-{attempt}", store)
    register_gloo_one_worker()
    _waited_for(lambda: torch_dist.init_process_group(GLOO_ONE_WORKER, store=store, rank=rank,
                                                      world_size=world_size, timeout=COLLECTIVE_TIMEOUT),
                "seq2onnx-connect")

    def terminated(signum: int, frame: Any) -> None:
        # Once: the process is on its way out. (A killed launcher's death signal comes again each time this
        # process passes to another of its dying threads.)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    signal.signal(signal.SIGTERM, terminated)
    return Dist(rank=torch_dist.get_rank(), world_size=torch_dist.get_world_size(),
                local_rank=int(os.environ.get("LOCAL_RANK", "0")), launcher=launcher, store=store)


def leave(dist: Dist, timeout: timedelta = LEAVE_TIMEOUT) -> None:
    """The end of a run, on every rank: wait (at most `timeout`) until every rank has come here, which also lets
    this process's gloo worker drop every earlier collective (`training.gloo`), then leave the job. A rank
    that died or never came is named in a PeerFailedError; the process group is gone either way. A rank leaving
    on an error calls `stop` instead: its peers may be inside another collective, which a barrier would meet."""
    started = time.monotonic()
    try:
        if dist.store is not None:
            dist.store.set(f"{LEFT_KEY}/{dist.rank}", "1")
        options = torch_dist.BarrierOptions()
        options.timeout = timeout
        work = torch_dist.group.WORLD.barrier(options)
        while not work.is_completed():
            time.sleep(LEAVE_POLL_S)  # the GIL free for the worker, which drops earlier collectives first
        work.wait()  # raises the barrier's error: a peer gone, or the timeout
    except RuntimeError as err:
        waited = timeout if time.monotonic() - started >= timeout.total_seconds() else None
        raise _absent(dist, err, waited) from None
    finally:
        stop()


def _absent(dist: Dist, err: RuntimeError, waited: timedelta | None) -> PeerFailedError:
    """Why `leave`'s meeting failed (`waited`: it ran out of time), naming the ranks that never came (from the
    store, when it still answers)."""
    try:
        missing = [r for r in range(dist.world_size) if not dist.store.check([f"{LEFT_KEY}/{r}"])]
    except (RuntimeError, AttributeError):  # its host (torchrun's agent) is gone too, or no store at all
        missing = []
    if not missing:
        return PeerFailedError(f"another process of the run stopped while the processes were leaving "
                               f"({_first_line(err)})")
    who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {', '.join(map(str, missing))}"
    what = ("stopped before the end of the run" if waited is None
            else f"did not reach the end of the run within {waited.total_seconds():g} s")
    return PeerFailedError(f"{who} of {dist.world_size} {what} ({_first_line(err)})")


def stop() -> None:
    """Leave the job now, without meeting the others (a rank stopping on an error; `leave` ends a run). A SIGTERM
    from here on (torchrun stopping the others after this rank failed) is ignored: the process is on its way out,
    its message said, and raising in its exit handlers would only print a traceback."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def is_main(dist: Dist | None) -> bool:
    """One process, or rank 0 of a torchrun job: the process that shows progress and writes."""
    return dist is None or dist.is_main


def ddp_call(dist: Dist | None, call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)`; under torchrun, a broken connection to another rank inside it is PeerFailedError."""
    return call(*args) if dist is None else dist.talk(call, *args)


def global_loss(loss_sum: torch.Tensor, count: int, dist: Dist | None) -> tuple[torch.Tensor, float, int]:
    """(the loss to backpropagate, the step's summed loss, its item count), both over every rank: `loss_sum` over
    this rank's `count` items, divided by the whole step's count; times the world size, which DDP's gradient
    averaging divides out again. One process: the plain mean."""
    if dist is None:
        return loss_sum / count, loss_sum.item(), count
    total, items = dist.all_sum(loss_sum.item(), count)
    return loss_sum * (dist.world_size / items), total, int(items)
