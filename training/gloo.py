"""torch's gloo backend with one worker thread, registered as a backend of its own (`GLOO_ONE_WORKER`)."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

GLOO_ONE_WORKER = "seq2onnx_gloo"  # gloo with one worker thread, registered under this name by `start`
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # the network interfaces gloo binds, as torch's own gloo reads them


def _one_worker_gloo(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """torch's gloo backend with one worker thread, where torch's default group gets two and no option to change it.

    Why: a gloo worker runs a collective, wakes the caller, and only then drops its own reference to the
    collective. That frees Python objects (tensors made in Python; the context torch stashes for the length of a
    backward pass, which DDP's gradient all-reduce captures), so the worker takes the GIL. When the caller has
    reached interpreter shutdown by then (a rank that leaves right after its last collective), CPython ends the
    worker with pthread_exit, whose unwinding through a noexcept destructor calls std::terminate: SIGABRT,
    'terminate called without an active exception'. With one worker the queue runs in order and each collective
    is dropped before the next is taken, so a collective that completes proves every earlier one dropped: the
    barrier in `leave`. Two workers let two DDP gradient buckets travel at once, which bought nothing measurable
    (benchmarks/ddp_bench.py, 2 processes, samples/s with one worker vs two: the default model, one bucket, 4577
    vs 4435; hidden 512, 13.7 MiB of gradients in several buckets, 682 vs 694)."""
    gloo = torch_dist.ProcessGroupGloo
    interfaces = [name for name in os.environ.get(GLOO_SOCKET_IFNAME, "").split(",") if name]
    options = gloo._Options()
    options._devices = ([gloo.create_device(interface=name) for name in interfaces] if interfaces
                        else [gloo.create_default_device()])
    options._timeout = timeout
    options._threads = 1
    return gloo(store, rank, size, options)


def register_gloo_one_worker() -> None:
    """Make GLOO_ONE_WORKER a backend `init_process_group` knows (once per process)."""
    if not hasattr(torch_dist.Backend, GLOO_ONE_WORKER.upper()):
        torch_dist.Backend.register_backend(GLOO_ONE_WORKER, _one_worker_gloo, devices=["cpu"])
