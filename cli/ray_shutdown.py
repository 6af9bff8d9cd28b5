"""Stopping the local Ray that `serve --ray` and `infer --ray` start, without Ray's idle seconds.

Those commands start Ray with SIGTERM blocked in its processes (`cli.ray_stop.keep_group_signals_from_ray`).
`ray.shutdown` sends each of its processes SIGTERM and waits a second for it to exit before it sends SIGKILL, one
process after another: with SIGTERM blocked, each wait runs out, and the stop took 5.3 s of waiting on five
processes here for the same kills. `leave_ray` has `ray.shutdown` kill them at once: the raylet with what it
started (its agents and workers) first, then the rest as Ray orders them.

The raylet's agents must go with it, by the kill: left to notice the raylet's end, they wait ~2 s, then report it
to the GCS, which by then is gone, and they stayed for good.

Ray's node object and its `kill_all_processes` are not public API. Where they are not as this module expects (a Ray
other than the one it was written for), `ray.shutdown` runs as it is, slower, never wrong."""
from __future__ import annotations

import contextlib
import inspect
import signal
import time
from typing import Any

REAP_S = 5.0  # the most to wait for a killed process to be gone (Ray waits as long for its own kills)
POLL_S = 0.01


def leave_ray() -> bool:
    """`ray.shutdown()`: disconnect; a Ray this process started stops, its processes killed at once. True when the
    processes were killed here, False when Ray stopped them its own way (none started here, or an unknown Ray)."""
    import ray

    node = _local_node()
    if node is None:
        ray.shutdown()
        return False
    kill_all = node.kill_all_processes
    node.kill_all_processes = lambda **options: _kill_at_once(node, kill_all, options)
    try:
        ray.shutdown()
    finally:
        with contextlib.suppress(AttributeError):
            del node.kill_all_processes  # the instance's; the class's method again
    return True


def _local_node() -> Any:
    """The node of the Ray this process started, if it is one this module knows how to stop; else None."""
    try:
        from ray._private import ray_constants, worker

        node = worker._global_node
        processes = node.all_processes if node is not None else None
        raylets = processes.get(ray_constants.PROCESS_TYPE_RAYLET) if isinstance(processes, dict) else None
    except (ImportError, AttributeError):
        return None
    if not raylets or not callable(getattr(node, "kill_all_processes", None)):
        return None  # joined a cluster (nothing started here), or stopped already
    try:  # ray.shutdown passes it by name, which the replacement overrides
        if "allow_graceful" not in inspect.signature(node.kill_all_processes).parameters:
            return None
    except (TypeError, ValueError):
        return None
    if not all(callable(getattr(getattr(info, "process", None), "kill", None)) for info in raylets):
        return None
    return node


def _kill_at_once(node: Any, kill_all: Any, options: dict) -> None:
    """Ray's `kill_all_processes`, called by `ray.shutdown` once the driver has disconnected: kill the raylet and
    every process under it, wait for them, then have Ray kill the rest with no SIGTERM first."""
    import psutil
    from ray._private import ray_constants

    raylets = [info.process for info in node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, [])]
    for raylet in raylets:  # first: stopped, it starts no worker between the listing and the kill
        with contextlib.suppress(OSError):
            raylet.send_signal(signal.SIGSTOP)
    under: list[psutil.Process] = []
    for raylet in raylets:
        with contextlib.suppress(psutil.Error):
            under += psutil.Process(raylet.pid).children(recursive=True)
    for raylet in raylets:
        with contextlib.suppress(OSError):
            raylet.kill()
    for process in under:
        with contextlib.suppress(psutil.Error):
            process.kill()
    for raylet in raylets:  # reaped: Ray's own pass then skips it
        with contextlib.suppress(Exception):
            raylet.wait(REAP_S)
    _wait_dead(under, REAP_S)
    kill_all(**{**options, "allow_graceful": False})


def _wait_dead(processes: list, timeout_s: float) -> None:
    """Wait up to `timeout_s` until each of `processes` (killed; not this process's children) is gone or a zombie:
    dead, and reaped by whoever adopted it, on its own time (psutil.wait_procs waited for that: 1.1-1.8 s here)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while processes and time.monotonic() < deadline:
        alive = []
        for process in processes:
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        processes = alive
        if processes:
            time.sleep(POLL_S)
