"""The two sides of benchmarks/serve_bench.py's cells: the servers it starts (`seq2onnx serve` as a process of its
own, a local Ray with Serve and the app deployed) and the clients that load them (threads calling translate_batch
in-process, an aiohttp session of N connections, or wrk), each cell's requests handed out by one Budget."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.model import Seq2Seq
from runtime.search.beam import MAX_BEAM

RAY_CPUS = 2
MAX_BATCH = 32
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage-stats reporting from a benchmark cluster
APP_NAME = "serve-bench"
READY = "Ctrl-C stops"  # the server's ready line
THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}  # Ray Serve's documented high-throughput switch
DIRECT_PORTS = range(30000, 31000)  # Ray Serve's default direct-ingress HTTP ports (RAY_SERVE_DIRECT_INGRESS_*)
WARMUP_PER_WORKER = 2
REQUEST_TIMEOUT_S = 30.0
START = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the run began."""
    print(f"[{time.monotonic() - START:6.1f} s] {message}", file=sys.stderr, flush=True)


class Budget:
    """Hands out request indices until `count` are out or `seconds` have passed (shared by a cell's workers)."""

    def __init__(self, count: int, seconds: float) -> None:
        self.count, self.deadline, self.next = count, time.monotonic() + seconds, 0
        self.lock = threading.Lock()

    def take(self) -> int | None:
        """The next request's index, or None when the cell is over."""
        with self.lock:
            if self.next >= self.count or time.monotonic() >= self.deadline:
                return None
            self.next += 1
            return self.next - 1


@dataclass
class Cell:
    """One mode at one concurrency: what each answered request took, and what failed."""

    mode: str
    concurrency: int
    latencies_ms: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    replicas_seen: set[str] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    phase: str = ""

    def figures(self) -> dict[str, Any]:
        """The cell's row: counts, throughput, latency percentiles, requests per decode."""
        done, ms = len(self.latencies_ms), np.array(self.latencies_ms or [np.nan])  # (done,)
        batch = len(self.batches) / sum(1 / b for b in self.batches) if self.batches else None
        return {"mode": self.mode, "concurrency": self.concurrency, "requests": done, "errors": len(self.failures),
                "first_error": next(iter(self.failures), None), "seconds": self.seconds,
                "throughput": done / self.seconds if self.seconds else 0.0,
                "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                "mean_batch": batch, "replicas_seen": len(self.replicas_seen) or None}


def thread_worker(model: Seq2Seq, texts: list[str], budget: Budget, beam: int, cell: Cell) -> None:
    """Decode one text per call until the budget runs out."""
    while (i := budget.take()) is not None:
        start = time.perf_counter()
        try:
            model.translate_batch([texts[i % len(texts)]], beam_size=beam)
        except Exception as exc:  # noqa: BLE001 -- a benchmark counts failures, it does not stop at one
            cell.failures.append(repr(exc))
            continue
        cell.latencies_ms.append((time.perf_counter() - start) * 1e3)  # list.append is atomic: no lock


def in_process_cell(model: Seq2Seq, texts: list[str], concurrency: int, requests: int, seconds: float,
                    beam: int, mode: str) -> Cell:
    """`concurrency` threads calling translate_batch([text]) on one loaded model."""
    def run(budget: Budget, cell: Cell) -> None:
        with ThreadPoolExecutor(concurrency) as pool:
            for _ in range(concurrency):
                pool.submit(thread_worker, model, texts, budget, beam, cell)

    run(Budget(WARMUP_PER_WORKER * concurrency, seconds), Cell(mode, concurrency))
    cell = Cell(mode, concurrency)
    start = time.perf_counter()
    run(Budget(requests, seconds), cell)
    cell.seconds = time.perf_counter() - start
    return cell


async def http_worker(session: Any, url: str, texts: list[str], budget: Budget, beam: int, cell: Cell) -> None:
    """POST one text per request until the budget runs out."""
    import aiohttp

    while (i := budget.take()) is not None:
        start = time.perf_counter()
        try:
            async with session.post(f"{url}/v1/translate", json={"texts": [texts[i % len(texts)]],
                                                                 "beam_size": beam}) as reply:
                text = await reply.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            cell.failures.append(repr(exc))
            continue
        if reply.status != 200:
            cell.failures.append(f"HTTP {reply.status}: {text[:200]}")
            continue
        cell.latencies_ms.append((time.perf_counter() - start) * 1e3)
        cell.batches.append(int(reply.headers["x-seq2onnx-batch-requests"]))
        cell.replicas_seen.add(reply.headers["x-seq2onnx-replica"])


async def http_cell(url: str, texts: list[str], concurrency: int, requests: int, seconds: float, beam: int,
                    mode: str) -> Cell:
    """`concurrency` async workers sharing one aiohttp session (a pool of `concurrency` connections). aiohttp, not
    httpx: measured here, an httpx AsyncClient alone tops out near 250 requests/s at 32 connections (700 at 1),
    aiohttp near 5,000 (1,750 at 1) against the same trivial route, so httpx would measure itself."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def run(budget: Budget, cell: Cell) -> None:
            await asyncio.gather(*(http_worker(session, url, texts, budget, beam, cell) for _ in range(concurrency)))

        await run(Budget(WARMUP_PER_WORKER * concurrency, seconds), Cell(mode, concurrency))
        cell = Cell(mode, concurrency)
        start = time.perf_counter()
        await run(Budget(requests, seconds), cell)
        cell.seconds = time.perf_counter() - start
        return cell


WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local texts = {%s}
local i = 0
request = function()
  i = i + 1
  return wrk.format(nil, nil, nil, '{"texts": ["' .. texts[(i %% #texts) + 1] .. '"], "beam_size": %d}')
end
"""
WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_cell(url: str, texts: list[str], concurrency: int, seconds: float, beam: int, mode: str,
             script: Path) -> dict[str, Any]:
    """wrk (C, Debian's package) at `concurrency` connections for `seconds`: what it reports, and the requests per
    decode from the server's /metrics before and after (for Ray: the replica that answers /metrics)."""
    script.write_text(WRK_SCRIPT % (", ".join(json.dumps(x) for x in texts), beam))
    before = decode_counts(url)
    # one client thread: it keeps up, and leaves the most CPU to the server
    done = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency",
                           "-s", str(script), f"{url}/v1/translate"], capture_output=True, text=True, check=True)
    after = decode_counts(url)
    out = done.stdout
    latency = {q: float(v) * WRK_UNITS[unit] for q, v, unit in re.findall(r"\n\s+(50|99)%\s+([0-9.]+)(us|ms|s)\b", out)}
    total = int(re.search(r"(\d+) requests in", out).group(1))
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    decodes = after[1] - before[1]
    return {"mode": mode, "concurrency": concurrency, "requests": total, "errors": errors,
            "first_error": None, "seconds": seconds,
            "throughput": float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1)),
            "p50_ms": latency.get("50", float("nan")), "p99_ms": latency.get("99", float("nan")),
            "mean_batch": (after[0] - before[0]) / decodes if decodes else None, "replicas_seen": None}


def decode_counts(url: str) -> tuple[float, float]:
    """(requests decoded, decodes) so far, from the server's /metrics (items per request: one here)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = {name: float(value) for name, value in
             re.findall(r"^seq2onnx_batch_items_(sum|count) ([0-9.e+]+)$", text, re.MULTILINE)}
    return found.get("sum", 0.0), found.get("count", 0.0)


@contextlib.contextmanager
def local_serve(optimized: bool = False) -> Iterator[str]:
    """A local Ray and Serve on 127.0.0.1 -> the base URL (`optimized`: Ray Serve's throughput options, set before
    Ray starts so that every Serve process reads them); Serve and Ray shut down whatever happens."""
    import ray
    from ray import serve

    extra = {**RAY_ENV, **(THROUGHPUT_ENV if optimized else {})}
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)  # before ray.init: Ray's child processes inherit it
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # this script's progress lines say what happens
    # address='local': a new Ray of our own, never one that another process on this machine has started
    ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # after ray.init, which sets its own: ends in finally
    try:
        port = free_port()  # after Ray has taken its own
        logs = {"enable_access_log": False, "log_level": "WARNING"} if optimized else None
        serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": REQUEST_TIMEOUT_S},
                    logging_config=logs)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        progress("Serve and Ray shut down")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(model_dir: Path, threads: int, batch_wait_ms: float, log: Path, workers: int = 1,
                   allocator: str = "auto") -> Iterator[str]:
    """`seq2onnx serve MODEL_DIR` in a process of its own -> the base URL once it is ready; SIGTERM at the end."""
    port = free_port()
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", str(model_dir), "--port", str(port),
                                 "--num-cpus", str(threads), "--max-batch-size", str(MAX_BATCH), "--batch-wait-ms",
                                 str(batch_wait_ms), "--workers", str(workers), "--allocator", allocator,
                                 "--max-beam-size", str(MAX_BEAM)], stdout=sink,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while READY not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"seq2onnx serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        progress("seq2onnx serve stopped")


def deploy(model_dir: Path, replicas: int, batch_wait_ms: float) -> None:
    """(Re)deploy the app with `replicas` fixed replicas sharing the Ray CPUs; returns once they are healthy."""
    from ray import serve

    from serving.app import build_app
    from serving.config import Replicas, ServeConfig

    if APP_NAME in serve.status().applications:  # deleted first: the old replicas free their CPUs for the new
        serve.delete(APP_NAME)
    config = ServeConfig(num_cpus=RAY_CPUS / replicas, max_batch_size=MAX_BATCH, batch_wait_ms=batch_wait_ms,
                         replicas=Replicas(replicas, replicas), max_beam_size=MAX_BEAM)
    serve.run(build_app(model_dir, config), name=APP_NAME, route_prefix="/")


def direct_url() -> str | None:
    """The base URL of the one replica's own HTTP port (direct ingress), or None when there is none. Ray does not
    publish it: a loopback port listening in Ray's range whose /healthz names a replica, as this app's does."""
    import urllib.request

    listening = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port = local.split(":")
            if state == "0A" and address == "0100007F" and int(port, 16) in DIRECT_PORTS:  # LISTEN on 127.0.0.1
                listening.add(int(port, 16))
    for port in sorted(listening):
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
                if "replica" in json.loads(reply.read()):
                    return f"http://127.0.0.1:{port}"
    return None
