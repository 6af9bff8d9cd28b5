"""Load on `seq2onnx serve` (Ray Serve over HTTP) against the same requests decoded in-process, side by side.

    python benchmarks/serve_bench.py [MODEL_DIR] [--requests 400] [--duration 15] [--concurrency 1 8 32]
                                     [--replicas 1 2] [--beam 1] [--threads 2] [--json FILE]

Each request is one text (MODEL_DIR: artifacts/dates), drawn seeded from fixed dates, greedy unless --beam. A cell
(one mode, one concurrency N): N workers send back to back, after 2 warm-up requests each, until --requests are
done or --duration s have passed; --max-total skips or shortens cells past it. Modes, in this order:
  in-process    Seq2Seq.load(threads=--threads).translate_batch([text]) from N threads: no HTTP, Ray or batching.
  serve R       a local Ray (2 CPUs), Serve on 127.0.0.1, build_app(ServeConfig(num_cpus=2/R, max_batch_size=32)):
                R=1 decodes on 2 onnxruntime threads, R=2 on 1 each. The client: one httpx.AsyncClient (a pool of
                N connections) in this process, on the same 2 cores.
Per cell: requests answered, errors (non-200 or none), throughput, p50/p99 client latency, and requests per decode
from x-seq2onnx-batch-requests (requests / sum of 1/b: a batch of 8 counts once). Then throughput ratios.

Found (2 shared cores, load 1-12, 4 runs): serve peaks at 70-110 req/s against 800-1450 in-process (0.04-0.10x);
2 replicas over 1 swings from 0.7x to 1.4x between runs. At 32 workers, ~100 req/s, top shows the proxy actor at
~65% of a core, the replica(s) ~70% together, this client ~40%: ~18 ms of CPU per request, against ~1 ms to
decode one in-process, so the cores go to per-request Python, not the model; and Ray's actors run at nice 15.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from runtime.model import Seq2Seq

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "artifacts" / "dates"
RAY_CPUS = 2
MAX_BATCH = 32
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage-stats reporting from a benchmark cluster
APP_NAME = "serve-bench"
WARMUP_PER_WORKER = 2
REQUEST_TIMEOUT_S = 30.0
TEXTS = ("tuesday, march 3 2015", "3/3/15", "03 mar 2015", "march 3, 2015", "2015.03.03", "3 march 2015",
         "tue 03 mar 2015", "03/03/2015", "20150303", "tuesday 3 march 2015", "saturday, january 1 2000",
         "12/31/99", "17 jul 1984", "october 21, 2027", "1972.11.05", "29 february 2048", "fri 09 aug 1991",
         "06/15/2003", "19880704", "sunday 25 december 2011", "1/2/03", "22 sep 1979", "may 30, 2049",
         "2000.02.29", "wednesday, june 14 1995", "8 april 2036", "mon 01 jan 1970", "11/11/2011")
START = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since the run began."""
    print(f"[{time.monotonic() - START:6.1f} s] {message}", file=sys.stderr, flush=True)


def draw_texts(count: int, seed: int) -> list[str]:
    """`count` texts drawn from TEXTS by a seeded generator: every mode sends the same sequence."""
    rng = np.random.default_rng(seed)
    return [TEXTS[i] for i in rng.integers(len(TEXTS), size=count)]


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


async def http_worker(client: httpx.AsyncClient, texts: list[str], budget: Budget, beam: int, cell: Cell) -> None:
    """POST one text per request until the budget runs out."""
    while (i := budget.take()) is not None:
        start = time.perf_counter()
        try:
            reply = await client.post("/v1/translate", json={"texts": [texts[i % len(texts)]], "beam_size": beam})
        except httpx.HTTPError as exc:
            cell.failures.append(repr(exc))
            continue
        if reply.status_code != 200:
            cell.failures.append(f"HTTP {reply.status_code}: {reply.text[:200]}")
            continue
        cell.latencies_ms.append((time.perf_counter() - start) * 1e3)
        cell.batches.append(int(reply.headers["x-seq2onnx-batch-requests"]))
        cell.replicas_seen.add(reply.headers["x-seq2onnx-replica"])


async def http_cell(url: str, texts: list[str], concurrency: int, requests: int, seconds: float, beam: int,
                    mode: str) -> Cell:
    """`concurrency` async workers sharing one client (one pool of `concurrency` connections)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=REQUEST_TIMEOUT_S) as client:
        async def run(budget: Budget, cell: Cell) -> None:
            await asyncio.gather(*(http_worker(client, texts, budget, beam, cell) for _ in range(concurrency)))

        await run(Budget(WARMUP_PER_WORKER * concurrency, seconds), Cell(mode, concurrency))
        cell = Cell(mode, concurrency)
        start = time.perf_counter()
        await run(Budget(requests, seconds), cell)
        cell.seconds = time.perf_counter() - start
        return cell


@contextlib.contextmanager
def local_serve() -> Iterator[str]:
    """A local Ray and Serve on 127.0.0.1 -> the base URL; Serve and Ray shut down whatever happens."""
    import ray
    from ray import serve

    os.environ.update(RAY_ENV)  # before ray.init: Ray's child processes inherit it
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # this script's progress lines say what happens
    # address='local': a new Ray of our own, never one that another process on this machine has started
    ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # after ray.init, which sets its own: ends in finally
    try:
        with socket.socket() as sock:  # a free port, found after Ray has taken its own
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": REQUEST_TIMEOUT_S})
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        progress("Serve and Ray shut down")


def deploy(model_dir: Path, replicas: int, batch_wait_ms: float) -> None:
    """(Re)deploy the app with `replicas` fixed replicas sharing the Ray CPUs; returns once they are healthy."""
    from ray import serve

    from serving.app import build_app
    from serving.config import Replicas, ServeConfig

    if APP_NAME in serve.status().applications:  # deleted first: the old replicas free their CPUs for the new
        serve.delete(APP_NAME)
    config = ServeConfig(num_cpus=RAY_CPUS / replicas, max_batch_size=MAX_BATCH, batch_wait_ms=batch_wait_ms,
                         replicas=Replicas(replicas, replicas))
    serve.run(build_app(model_dir, config), name=APP_NAME, route_prefix="/")


def cell_seconds(args: argparse.Namespace) -> float:
    """This cell's wall-time cap: --duration, or what is left of --max-total."""
    return min(args.duration, args.max_total - (time.monotonic() - START))


def run_all(args: argparse.Namespace, texts: list[str]) -> list[Cell]:
    """Every mode at every concurrency, in-process first (before Ray starts), then each replica count."""
    cells: list[Cell] = []
    model = Seq2Seq.load(args.model_dir, threads=args.threads)
    for n in args.concurrency:
        if (seconds := cell_seconds(args)) > 1:
            cells.append(in_process_cell(model, texts, n, args.requests, seconds, args.beam,
                                         f"in-process ({args.threads} thr)"))
            report(cells[-1])
    del model
    with local_serve() as url:
        progress(f"Serve on {url}")
        for replicas in args.replicas:
            if cell_seconds(args) <= 1:
                break
            deploy(args.model_dir, replicas, args.batch_wait_ms)
            progress(f"deployed {replicas} replica(s) at {RAY_CPUS / replicas:g} CPUs each")
            for n in args.concurrency:
                if (seconds := cell_seconds(args)) > 1:
                    cells.append(asyncio.run(http_cell(url, texts, n, args.requests, seconds, args.beam,
                                                       serve_mode(replicas))))
                    report(cells[-1])
    return cells


def report(cell: Cell) -> None:
    """A progress line for a finished cell."""
    f = cell.figures()
    first = f" (first: {f['first_error']})" if f["errors"] else ""
    progress(f"{f['mode']}, concurrency {f['concurrency']}: {f['requests']} requests in {f['seconds']:.1f} s, "
             f"{f['errors']} errors{first}, {f['throughput']:.1f} req/s")


def serve_mode(replicas: int) -> str:
    """A serve mode's name in the table."""
    return f"serve {replicas} replica{'s' * (replicas > 1)}"


def ratios(rows: list[dict[str, Any]], replicas: list[int], levels: list[int]) -> list[tuple[str, int, float]]:
    """(what, concurrency, throughput ratio): each serve mode over in-process, most replicas over fewest."""
    tput = {(r["mode"].split(" (")[0], r["concurrency"]): r["throughput"] for r in rows}
    modes = [serve_mode(n) for n in sorted(replicas)]
    pairs = [(mode, "in-process") for mode in modes] + ([(modes[-1], modes[0])] if len(modes) > 1 else [])
    return [(f"{a} / {b}", c, tput[a, c] / tput[b, c]) for a, b in pairs for c in levels
            if (a, c) in tput and tput.get((b, c))]


def table(rows: list[dict[str, Any]], found: list[tuple[str, int, float]]) -> str:
    """The figures as a fixed-width table, then the ratios."""
    lines = [f"{'mode':<24}{'conc':>5}{'requests':>10}{'errors':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'batch':>7}"]
    for r in rows:
        batch = "-" if r["mode"].startswith("in-process") else f"{r['mean_batch'] or 0:.2f}"
        lines.append(f"{r['mode']:<24}{r['concurrency']:>5}{r['requests']:>10}{r['errors']:>8}"
                     f"{r['throughput']:>9.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{batch:>7}")
    lines.append("")
    lines += [f"throughput {what:<36} concurrency {c:>3}: {ratio:5.2f}x" for what, c, ratio in found]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT_MODEL, help="a token model's export")
    p.add_argument("--requests", type=int, default=400, help="at most this many requests per cell")
    p.add_argument("--duration", type=float, default=15.0, help="at most this many seconds per cell")
    p.add_argument("--max-total", type=float, default=240.0, help="seconds for the whole run, Ray start included")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="workers sending at once")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="replica counts to deploy in turn")
    p.add_argument("--beam", type=int, default=1, help="beam_size (1: greedy)")
    p.add_argument("--threads", type=int, default=2, choices=[1, 2], help="in-process onnxruntime threads")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="Serve's batch wait (ServeConfig)")
    p.add_argument("--seed", type=int, default=0, help="seeds the draw of texts")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to FILE")
    args = p.parse_args(argv)
    if min(args.concurrency + args.replicas + [args.requests, args.beam]) < 1 or args.duration <= 0:
        p.error("--requests, --concurrency, --replicas and --beam must be at least 1; --duration above 0")
    if not (args.model_dir / "manifest.json").is_file():
        p.error(f"{args.model_dir}: no manifest.json there; pass an export directory of a token model")
    if args.json and not args.json.parent.is_dir():  # said now, not after minutes of load
        p.error(f"--json {args.json}: its directory does not exist")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every cell, print the table and ratios, and write --json if asked."""
    args = parse_args(argv)
    texts = draw_texts(args.requests, args.seed)
    load = os.getloadavg()
    rows = [cell.figures() for cell in run_all(args, texts)]
    found = ratios(rows, args.replicas, args.concurrency)
    print(f"{args.model_dir.name}: one text per request, beam {args.beam}, at most {args.requests} requests or "
          f"{args.duration:g} s per cell; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(table(rows, found))
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        figures = {"settings": settings, "cells": rows, "load_average": [load[0], os.getloadavg()[0]],
                   "ratios": [{"what": w, "concurrency": c, "ratio": r} for w, c, r in found]}
        args.json.write_text(json.dumps(figures, indent=2, sort_keys=True))
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: Serve and Ray are already shut down
        sys.exit(130)
