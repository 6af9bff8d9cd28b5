"""Run by tests/test_distributed.py under torchrun (2 ranks): a few DDP steps on three small models, then the ranks
leave at different times, through `training.distributed.leave` (or `stop`, or not at all).

    ddp_leave_worker.py [--lag-rank R --lag S] [--starve-rank R] [--ending leave|stop|vanish|stuck] [--timeout S]

--starve-rank opens on purpose the window in which a rank can abort on its way out: that rank runs on one CPU,
its gloo worker threads under SCHED_IDLE, so they get the CPU only while every other thread of the process waits.
A finished collective is then still being dropped by its worker (which takes the GIL) when the main thread has
reached interpreter shutdown, unless the rank waited for it. --lag-rank makes the other rank come late.
--ending: how rank 1 ends (rank 0 always calls `leave`): `leave`, `stop` (leave without meeting; rank 0 too),
`vanish` (exit 0 without leaving: gone before the end of the run), `stuck` (sleep 10 minutes before leaving).
Each rank prints `rank R: gloo workers N` after its first collective, `rank R left` once it has left, and on a failed meeting
`rank R: <message>` and exit status 3.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.distributed import Dist, PeerFailedError, leave, start, stop

GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives gloo's worker threads
FAILED = 3


def threads() -> dict[int, str]:
    """{thread id: name} of this process's threads."""
    return {int(t): Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")}


def starve_gloo_workers() -> None:
    """This process on one CPU, its gloo workers under SCHED_IDLE (they run only when nothing else here can)."""
    cpu = min(os.sched_getaffinity(0))
    for tid, name in threads().items():
        os.sched_setaffinity(tid, {cpu})
        if name == GLOO_WORKER_THREAD:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def train(dist: Dist) -> None:
    """Three small DDP models, four steps each: the last collective is a gradient all-reduce from backward."""
    torch.manual_seed(0)
    for _ in range(3):
        model = dist.wrap(nn.Linear(8, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(5, 8)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lag-rank", type=int, default=None)
    parser.add_argument("--lag", type=float, default=0.0)
    parser.add_argument("--starve-rank", type=int, default=None)
    parser.add_argument("--ending", choices=["leave", "stop", "vanish", "stuck"], default="leave")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    dist = start()
    dist.all_sum(1.0)  # gloo's workers name themselves once running: after a collective, they are
    workers = sum(name == GLOO_WORKER_THREAD for name in threads().values())
    print(f"rank {dist.rank}: gloo workers {workers}", flush=True)
    if dist.rank == args.starve_rank:
        starve_gloo_workers()
    train(dist)
    if dist.rank == args.lag_rank:
        time.sleep(args.lag)
    ending = args.ending if dist.rank == 1 else ("stop" if args.ending == "stop" else "leave")
    if ending == "vanish":
        os._exit(0)
    if ending == "stuck":
        time.sleep(600)
    try:
        if ending == "stop":
            stop()
        else:
            leave(dist, timeout=timedelta(seconds=args.timeout))
    except PeerFailedError as err:
        print(f"rank {dist.rank}: {err}", flush=True)
        sys.stdout.flush()
        os._exit(FAILED)
    print(f"rank {dist.rank} left", flush=True)


if __name__ == "__main__":
    main()
