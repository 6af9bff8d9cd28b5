"""Load on `seq2onnx serve` over HTTP, both backends, against the same requests decoded in-process, side by side.

    python benchmarks/serve_bench.py [MODEL_DIR] [--requests 100000] [--duration 5] [--concurrency 1 8 32]
                                     [--replicas 1 2] [--beam 1] [--threads 2] [--server-threads 1]
                                     [--server-workers 1 2] [--server-allocators system auto]
                                     [--no-ray] [--json FILE.json] [--plot FILE.png] [--force]

Each request is one text (MODEL_DIR: artifacts/dates), drawn seeded from fixed dates, greedy unless --beam. A cell
(one mode, one concurrency N): N workers send back to back, after 2 warm-up requests each, until --requests are
done or --duration s have passed; --max-total skips or shortens cells past it. Modes, in this order:
  in-process    Seq2Seq.load(threads=--threads).translate_batch([text]) from N threads: no HTTP, no batching.
  serve         `seq2onnx serve MODEL_DIR` (the default: one process, FastAPI on uvicorn) as a process of its own,
                --num-cpus --server-threads, --max-batch-size 32, --max-beam-size 256 (any --beam), --batch-wait-ms
                as given; with
                --server-workers N other than 1, "serve --workers N" (N copies decoding batches at once), one
                server process per value, all started together and measured one after another in each round;
                likewise with --server-allocators, "serve --allocator A" for A other than auto (the default).
  serve --ray R a local Ray (2 CPUs), Serve on 127.0.0.1, build_app(ServeConfig(num_cpus=2/R, max_batch_size=32,
                max_beam_size=256)):
                R=1 decodes on 2 onnxruntime threads, R=2 on 1 each; then the same with Ray's documented
                throughput options (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 for the whole Ray, access log off), "opt".
                Those options also start "direct ingress": each replica listens on a port of its own (Ray's range
                30000-31000, on Serve's host), bypassing the proxy; with one replica, "opt direct" posts there.
The client: one aiohttp session (a pool of N connections) in this process, on the same 2 cores.
Per cell: requests answered, errors (non-200 or none), throughput, p50/p99 client latency, and requests per decode
from x-seq2onnx-batch-requests (requests / sum of 1/b: a batch of 8 counts once). Then throughput ratios, and with
--plot a PNG of p50/p99 latency against throughput, one line per mode.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed copy
from bench_outputs import JSON, PNG, check_args, publish  # noqa: E402
from serve_load import (  # noqa: E402
    RAY_CPUS,
    START,
    deploy,
    direct_url,
    http_cell,
    in_process_cell,
    local_serve,
    progress,
    server_process,
    wrk_cell,
)

from cli.signals import raise_on_sigterm  # noqa: E402
from runtime.errors import Terminated  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.search.beam import MAX_BEAM  # noqa: E402

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "artifacts" / "dates"
MAX_CONCURRENCY = 1024  # workers sending at once: far past what 2 cores answer, where every cell measured something
MAX_BATCH_WAIT_MS = 10_000.0  # serve --batch-wait-ms's bound
IN_PROCESS = "in-process"
TEXTS = ("tuesday, march 3 2015", "3/3/15", "03 mar 2015", "march 3, 2015", "2015.03.03", "3 march 2015",
         "tue 03 mar 2015", "03/03/2015", "20150303", "tuesday 3 march 2015", "saturday, january 1 2000",
         "12/31/99", "17 jul 1984", "october 21, 2027", "1972.11.05", "29 february 2048", "fri 09 aug 1991",
         "06/15/2003", "19880704", "sunday 25 december 2011", "1/2/03", "22 sep 1979", "may 30, 2049",
         "2000.02.29", "wednesday, june 14 1995", "8 april 2036", "mon 01 jan 1970", "11/11/2011")


def draw_texts(count: int, seed: int) -> list[str]:
    """`count` texts drawn from TEXTS by a seeded generator: every mode sends the same sequence."""
    rng = np.random.default_rng(seed)
    return [TEXTS[i] for i in rng.integers(len(TEXTS), size=count)]


def cell_seconds(args: argparse.Namespace) -> float | None:
    """This cell's wall-time cap: --duration, or what is left of --max-total; None when less than a second is left."""
    left = args.max_total - (time.monotonic() - START)
    return min(args.duration, left) if left > 1 else None


def run_all(args: argparse.Namespace, texts: list[str]) -> list[dict[str, Any]]:
    """Every mode at every concurrency, in --rounds interleaved rounds: each round measures in-process, then each
    server, at one concurrency after another. Phases: the one-process server; then (unless --no-ray) Ray Serve with
    each replica count, default and optimized (Ray up for the whole phase, in-process measured beside it)."""
    rows: list[dict[str, Any]] = []
    model = Seq2Seq.load(args.model_dir, threads=args.threads)

    def interleaved(phase: str, servers: dict[str, str], tmp: Path) -> None:
        for _ in range(args.rounds):
            for n in args.concurrency:
                if (seconds := cell_seconds(args)) is None:
                    return
                found = [in_process_cell(model, texts, n, args.requests, seconds, args.beam, IN_PROCESS).figures()]
                for mode, url in servers.items():
                    if args.client == "wrk":
                        found.append(wrk_cell(url, texts, n, seconds, args.beam, mode, tmp / "post.lua"))
                    else:
                        found.append(asyncio.run(http_cell(url, texts, n, args.requests, seconds, args.beam,
                                                           mode)).figures())
                for row in found:
                    rows.append({**row, "phase": phase})
                    report(row)

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        with contextlib.ExitStack() as servers:
            urls = {server_mode(w, a): servers.enter_context(server_process(
                args.model_dir, args.server_threads, args.batch_wait_ms, tmp / f"serve{w}-{i}.log", w, a))
                for w in args.server_workers for i, a in enumerate(args.server_allocators)}
            progress(f"seq2onnx serve on {', '.join(urls.values())}")
            interleaved("one process", urls, tmp)
        for optimized in ([] if args.no_ray else [False, True]):
            with local_serve(optimized) as url:
                progress(f"Ray Serve on {url}{' (throughput options)' if optimized else ''}")
                for replicas in args.replicas:
                    if cell_seconds(args) is None:
                        break
                    deploy(args.model_dir, replicas, args.batch_wait_ms)
                    progress(f"deployed {replicas} replica(s) at {RAY_CPUS / replicas:g} CPUs each")
                    mode = serve_mode(replicas, optimized)
                    servers = {mode: url}
                    if optimized and replicas == 1 and (direct := direct_url()):
                        servers[f"{mode} direct"] = direct
                    interleaved(mode, servers, tmp)
    return rows


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (phase, mode, concurrency): medians over the rounds (throughput, p50, p99, batch), summed
    counts, and each round's throughput."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["phase"], row["mode"], row["concurrency"]), []).append(row)
    out = []
    for (phase, mode, n), group in groups.items():
        def median(key: str, group: list[dict[str, Any]] = group) -> float | None:
            values = [r[key] for r in group if r[key] is not None]
            return float(np.median(values)) if values else None

        out.append({"phase": phase, "mode": mode, "concurrency": n, "requests": sum(r["requests"] for r in group),
                    "errors": sum(r["errors"] for r in group),
                    "first_error": next((r["first_error"] for r in group if r["first_error"]), None),
                    "throughput": median("throughput"), "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
                    "mean_batch": median("mean_batch"), "rounds": [r["throughput"] for r in group]})
    return out


def report(f: dict[str, Any]) -> None:
    """A progress line for a finished cell."""
    first = f" (first: {f['first_error']})" if f["errors"] else ""
    progress(f"{f['mode']}, concurrency {f['concurrency']}: {f['requests']} requests in {f['seconds']:.1f} s, "
             f"{f['errors']} errors{first}, {f['throughput']:.1f} req/s")


def server_mode(workers: int, allocator: str = "auto") -> str:
    """A one-process server's mode name in the table: its options other than the defaults."""
    return "serve" + (f" --workers {workers}" if workers != 1 else "") + (
        f" --allocator {allocator}" if allocator != "auto" else "")


def serve_mode(replicas: int, optimized: bool = False) -> str:
    """A Ray Serve mode's name in the table."""
    return f"serve --ray {replicas}r{' opt' if optimized else ''}"


def ratios(rows: list[dict[str, Any]], levels: list[int]) -> list[tuple[str, int, float, list[float]]]:
    """(what, concurrency, ratio, each round's ratio): every server mode's throughput over in-process's measured
    just before it in the same round (same phase); the ratio is the median of the rounds' ratios, so that a round
    the shared machine slowed weighs on both sides at once."""
    rounds = {(r["phase"], r["mode"], r["concurrency"]): r["rounds"] for r in rows}
    found = []
    for phase, mode in dict.fromkeys((r["phase"], r["mode"]) for r in rows if r["mode"] != IN_PROCESS):
        for c in levels:
            if (phase, mode, c) in rounds and (phase, IN_PROCESS, c) in rounds:
                each = [s / i for s, i in zip(rounds[phase, mode, c], rounds[phase, IN_PROCESS, c]) if i]
                if each:
                    found.append((f"{mode} / in-process", c, float(np.median(each)), each))
    base = server_mode(1)
    for phase, mode in dict.fromkeys((r["phase"], r["mode"]) for r in rows if r["mode"].startswith(f"{base} --")):
        for c in levels:  # copies against one, each round's pair
            if (phase, mode, c) in rounds and (phase, base, c) in rounds:
                each = [w / o for w, o in zip(rounds[phase, mode, c], rounds[phase, base, c]) if o]
                if each:
                    found.append((f"{mode} / {base}", c, float(np.median(each)), each))
    return found


def plot(rows: list[dict[str, Any]], title: str, path: Path, force: bool) -> None:
    """p50 (solid) and p99 (dashed) latency against throughput, a point per concurrency: one colour per server
    mode; in-process, measured beside each of them, in grey."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.subplots()
    colours = iter(matplotlib.colormaps["tab10"](i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9))  # 7 is grey
    labelled = False
    for phase, mode in dict.fromkeys((r["phase"], r["mode"]) for r in rows):
        mine = sorted((r for r in rows if (r["phase"], r["mode"]) == (phase, mode)), key=lambda r: r["concurrency"])
        x = [r["throughput"] for r in mine]
        if mode == IN_PROCESS:
            label = None if labelled else "in-process (beside each server) p50 / p99"
            ax.plot(x, [r["p50_ms"] for r in mine], "-", color="0.6", lw=1, label=label)
            ax.plot(x, [r["p99_ms"] for r in mine], "--", color="0.6", lw=1)
            labelled = True
            continue
        colour = next(colours, "black")
        ax.plot(x, [r["p50_ms"] for r in mine], "-o", color=colour, label=f"{mode} p50")
        ax.plot(x, [r["p99_ms"] for r in mine], "--", color=colour, label=f"{mode} p99")
        for r in mine:
            ax.annotate(str(r["concurrency"]), (r["throughput"], r["p50_ms"]), fontsize="x-small")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput, requests/s (log)")
    ax.set_ylabel("client latency, ms (log): p50 solid, p99 dashed; labels: concurrent clients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title, fontsize="medium")
    publish(path, force, lambda f: fig.savefig(f, format="png", dpi=100))


def table(rows: list[dict[str, Any]], found: list[tuple[str, int, float, list[float]]]) -> str:
    """The figures as a fixed-width table, then the ratios."""
    lines = [f"{'phase':<20}{'mode':<26}{'conc':>5}{'requests':>10}{'errors':>8}{'req/s':>9}{'p50 ms':>9}"
             f"{'p99 ms':>9}{'batch':>7}"]
    for r in rows:
        batch = "-" if r["mode"] == IN_PROCESS else f"{r['mean_batch'] or 0:.2f}"
        lines.append(f"{r['phase']:<20}{r['mode']:<26}{r['concurrency']:>5}{r['requests']:>10}{r['errors']:>8}"
                     f"{r['throughput']:>9.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{batch:>7}")
    lines.append("")
    lines += [f"throughput {what:<42} concurrency {c:>3}: {ratio:5.2f}x  (rounds: "
              f"{', '.join(f'{x:.2f}' for x in each)})" for what, c, ratio, each in found]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dir", nargs="?", type=Path, default=DEFAULT_MODEL, help="a token model's export")
    p.add_argument("--requests", type=int, default=100_000,
                   help="at most this many requests per cell (in-process and aiohttp; wrk runs --duration)")
    p.add_argument("--duration", type=float, default=5.0, help="at most this many seconds per cell")
    p.add_argument("--max-total", type=float, default=900.0, help="seconds for the whole run, Ray starts included")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="workers sending at once")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="replica counts to deploy in turn")
    p.add_argument("--beam", type=int, default=1, help="beam_size (1: greedy)")
    p.add_argument("--threads", type=int, default=2, choices=[1, 2], help="in-process onnxruntime threads")
    p.add_argument("--server-threads", type=int, default=1, choices=[1, 2],
                   help="the one-process server's decoding threads (serve --num-cpus)")
    p.add_argument("--server-workers", type=int, nargs="+", default=[1],
                   help="the one-process server's copies of the model (serve --workers), one server per value")
    p.add_argument("--server-allocators", nargs="+", default=["auto"],
                   help="the one-process server's C allocator (serve --allocator), one server per value (with each "
                        "--server-workers count)")
    p.add_argument("--no-ray", action="store_true", help="leave out the Ray Serve modes")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; a cell's figures are their medians")
    p.add_argument("--client", choices=["wrk", "aiohttp"], default="wrk" if shutil.which("wrk") else "aiohttp",
                   help="the HTTP load generator: wrk (C; Debian's wrk package) when installed, else aiohttp")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="also write a latency-vs-throughput PNG")
    p.add_argument("--batch-wait-ms", type=float, default=0.0, help="the servers' batch wait (serve --batch-wait-ms)")
    p.add_argument("--seed", type=int, default=0, help="seeds the draw of texts")
    p.add_argument("--json", type=Path, default=None, metavar="FILE.json", help="also write the figures to FILE.json")
    p.add_argument("--force", action="store_true", help="replace an existing --json or --plot file")
    args = p.parse_args(argv)
    if min(args.concurrency + args.replicas + [args.requests, args.beam, args.rounds]) < 1 or not (
            math.isfinite(args.duration) and args.duration > 0):
        p.error("--requests, --concurrency, --replicas, --beam and --rounds must be at least 1; --duration a finite "
                f"number above 0, got {args.duration:g}")
    if not math.isfinite(args.max_total):
        p.error(f"--max-total: expected a finite number of seconds, got {args.max_total:g}")
    if args.beam > MAX_BEAM:
        p.error(f"--beam: expected at most {MAX_BEAM} (serve's limit), got {args.beam}")
    if max(args.concurrency) > MAX_CONCURRENCY:
        p.error(f"--concurrency: expected at most {MAX_CONCURRENCY} workers sending at once, got {max(args.concurrency)}")
    if not (math.isfinite(args.batch_wait_ms) and 0 <= args.batch_wait_ms <= MAX_BATCH_WAIT_MS):
        p.error(f"--batch-wait-ms: expected 0 to {MAX_BATCH_WAIT_MS:g} (serve --batch-wait-ms), got "
                f"{args.batch_wait_ms:g}")
    if args.client == "wrk" and shutil.which("wrk") is None:
        p.error("--client wrk: wrk is not installed here (Debian's wrk package); pass --client aiohttp")
    if min(args.server_workers) < 1:
        p.error(f"--server-workers: expected copies of at least 1, got {args.server_workers}")
    if len(set(args.server_workers)) < len(args.server_workers):
        p.error(f"--server-workers: each count once, got {args.server_workers}")
    if len(set(args.server_allocators)) < len(args.server_allocators):
        p.error(f"--server-allocators: each allocator once, got {args.server_allocators}")
    unknown = [a for a in args.server_allocators if a not in ("auto", "system", "mimalloc") and not Path(a).is_file()]
    if unknown:
        p.error(f"--server-allocators: expected auto, system, mimalloc or a library's path, got {unknown[0]!r}")
    if max(args.server_workers) * args.server_threads > len(os.sched_getaffinity(0)):
        p.error(f"--server-workers {max(args.server_workers)} x --server-threads {args.server_threads}: more than the "
                f"{len(os.sched_getaffinity(0))} CPUs this process may use")
    if args.max_total < 10:
        p.error(f"--max-total: expected at least 10 s (the server's start alone takes about 1 s), got {args.max_total:g}")
    manifest = args.model_dir / "manifest.json"
    if not manifest.is_file():
        p.error(f"{args.model_dir}: no manifest.json there; pass an export directory of a token model")
    kind = json.loads(manifest.read_text()).get("spec", {}).get("kind", "points")  # a spec without one: points
    if kind != "tokens":
        p.error(f"{args.model_dir}: a {kind} model; this benchmark posts texts, so it needs a token model's export "
                "(e.g. artifacts/dates)")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 -- said now, not after minutes of load
        except ImportError:
            p.error("--plot needs matplotlib: pip install -e '.[plot]'")
    if args.json and args.plot and args.json.resolve() == args.plot.resolve():
        p.error(f"--plot {args.plot}: is the --json file too; pass two different files")
    check_args(p, args.json, "--json", args.force, JSON)  # said now, not after minutes of load
    check_args(p, args.plot, "--plot", args.force, PNG)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every cell, print the table and ratios, and write --json if asked."""
    args = parse_args(argv)
    texts = draw_texts(args.requests, args.seed)
    load = os.getloadavg()
    rows = aggregate(run_all(args, texts))
    found = ratios(rows, args.concurrency)
    print(f"{args.model_dir.name}: one text per request, beam {args.beam}, at most {args.requests} requests or "
          f"{args.duration:g} s per cell, {args.rounds} interleaved rounds (req/s: their median); in-process on "
          f"{args.threads} thread(s), the one-process server on {args.server_threads}; client {args.client}; load "
          f"average {load[0]:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after")
    print(table(rows, found))
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        figures = {"settings": settings, "cells": rows, "load_average": [load[0], os.getloadavg()[0]],
                   "ratios": [{"what": w, "concurrency": c, "ratio": r, "rounds": e} for w, c, r, e in found]}
        text = json.dumps(figures, indent=2, sort_keys=True) + "\n"
        publish(args.json, args.force, lambda f: f.write(text.encode("utf-8")))  # whole or not at all
        progress(f"wrote {args.json}")
    if args.plot and rows:
        plot(rows, f"{args.model_dir.name}: one text per request, beam {args.beam}, {os.cpu_count()} CPUs", args.plot,
             args.force)
        progress(f"wrote {args.plot}")
    failed = [r for r in rows if r["errors"]]
    if not rows or failed:  # figures of failed requests are no figures
        what = (f"{len(failed)} cell(s) had failed requests (first: {failed[0]['mode']}, concurrency "
                f"{failed[0]['concurrency']}: {failed[0]['first_error']})" if failed
                else f"nothing was measured: --max-total {args.max_total:g} s ran out first")
        sys.exit(f"serve_bench: {what}")


if __name__ == "__main__":
    raise_on_sigterm()  # SIGTERM raises Terminated (a KeyboardInterrupt), so the servers are stopped as on Ctrl-C
    try:
        main()
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the servers, Serve and Ray are already shut down
        print(f"serve_bench: {'stopped by SIGTERM' if isinstance(stop, Terminated) else 'interrupted'}; no figures "
              "were kept", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # cleanup has run (the servers are stopped); an in-process cell's threads may still be inside onnxruntime,
        # whose teardown at interpreter exit then aborts ("terminate called without an active exception")
        os._exit(143 if isinstance(stop, Terminated) else 130)
