"""benchmarks/serve_bench.py runs as a user runs it: the one-process server in a process of its own, the aiohttp
client (CI has no wrk), in-process beside it; the table, ratios, JSON and PNG come out, with no errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.serve import DATES, ray_env

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ("1", "2") if len(os.sched_getaffinity(0)) >= 2 else ("1",)  # serve --workers 2 needs two CPUs


@pytest.mark.slow  # a server process and two 1 s cells per round
def test_serve_bench_prints_and_writes_its_figures(tmp_path: Any) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra's matplotlib")
    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    with ray_env():
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"), str(DATES), "--no-ray",
                               "--client", "aiohttp", "--rounds", "2", "--duration", "1", "--concurrency", "1", "4",
                               "--server-workers", *WORKERS, "--server-allocators", "auto", "system",
                               "--json", str(out), "--plot", str(png)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    cells = {(c["mode"], c["concurrency"]): c for c in figures["cells"]}
    servers = [mode + allocator for mode in ("serve", "serve --workers 2")[:len(WORKERS)]
               for allocator in ("", " --allocator system")]
    assert set(cells) == {(mode, n) for mode in ("in-process", *servers) for n in (1, 4)}
    for cell in cells.values():
        assert cell["errors"] == 0 and cell["throughput"] > 0 and len(cell["rounds"]) == 2, cell
    assert cells["serve", 4]["mean_batch"] >= 1  # requests per decode, read from the server's /metrics
    ratios = {(r["what"], r["concurrency"]): r for r in figures["ratios"]}
    pairs = [f"{mode} / in-process" for mode in servers] + [f"{mode} / serve" for mode in servers[1:]]
    assert set(ratios) == {(what, n) for what in pairs for n in (1, 4)}
    assert all(len(r["rounds"]) == 2 and r["ratio"] > 0 for r in ratios.values())
    assert "throughput serve / in-process" in done.stdout and png.read_bytes()[:4] == b"\x89PNG"


def _parse(*argv: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import serve_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return serve_bench.parse_args(list(argv))


@pytest.mark.parametrize("argv, code, said", [
    ((str(ROOT / "artifacts" / "squares"),), 2, "a points model; this benchmark posts texts"),
    (("--rounds", "0"), 2, "--rounds must be at least 1"),
    (("--server-workers", "1", "0"), 2, "--server-workers: expected copies of at least 1, got [1, 0]"),
    (("--server-workers", "2", "2"), 2, "--server-workers: each count once, got [2, 2]"),
    (("--server-workers", "999"), 2, "--server-workers 999 x --server-threads 1: more than the"),
    (("--server-allocators", "system", "system"), 2, "--server-allocators: each allocator once"),
    (("--server-allocators", "auto", "jemalloc"), 2, "expected auto, system, mimalloc or a library's path, got 'jema"),
    (("--max-total", "1"), 2, "--max-total: expected at least 10 s"),
    (("--json", "/nonexistent/dir/x.json"), 2, "directory '/nonexistent/dir' does not exist"),
    (("--json", "{taken}"), 1, "a file already exists there; pass --force"),
    (("--plot", "{tmp}/latency.jpg"), 2, "expected a file name ending in .png"),
    (("--json", "{tmp}/same.png", "--plot", "{tmp}/same.png"), 2, "is the --json file too"),
    (("--duration", "nan"), 2, "--duration a finite number above 0, got nan"),
    (("--batch-wait-ms", "-5"), 2, "--batch-wait-ms: expected 0 to 10000"),
    (("--beam", "1000"), 2, "--beam: expected at most 256"),
    (("--concurrency", "100000"), 2, "--concurrency: expected at most 1024"),
], ids=["points-model", "no-rounds", "no-workers", "workers-twice", "workers-past-cpus", "allocator-twice", "allocator-unknown", "no-time", "json-dir",
        "json-taken", "plot-suffix", "same-file", "duration-nan", "wait-negative", "beam-past-limit",
        "concurrency-past-limit"])
def test_serve_bench_refuses_runs_that_would_measure_nothing(argv: tuple[str, ...], code: int, said: str,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    if "--plot" in argv:
        pytest.importorskip("matplotlib", reason="--plot is checked only where matplotlib is installed")
    taken = tmp_path / "kept.json"
    taken.write_text("{}")  # a user's file: refused without --force, and left as it was
    with pytest.raises(SystemExit) as stopped:
        _parse(*(a.format(taken=taken, tmp=tmp_path) for a in argv))
    assert taken.read_text() == "{}"
    assert stopped.value.code == code and said in capsys.readouterr().err


def test_serve_bench_replaces_a_json_file_only_with_force(tmp_path: Path) -> None:
    taken = tmp_path / "kept.json"
    taken.write_text("{}")
    assert _parse("--json", str(taken), "--force").json == taken  # accepted; written whole after the run


def test_serve_bench_stops_its_server_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM stops it as Ctrl-C does: exit 143 with one line, its `seq2onnx serve` child stopped (it was left
    running, adopted by init)."""
    import signal
    import time

    from support.processes import alive

    log = tmp_path / "bench.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"), str(DATES), "--no-ray",
                                 "--client", "aiohttp", "--rounds", "50", "--duration", "1", "--concurrency", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        servers: list[int] = []
        while not servers and time.monotonic() < deadline:  # its server child, once started
            servers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _child_serve(p, proc.pid)]
            time.sleep(0.2)
        assert servers, log.read_text()[-2000:]
        while "seq2onnx serve on" not in log.read_text() and time.monotonic() < deadline:  # its server answers
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        stop = time.monotonic() + 30
        while any(alive(pid) for pid in servers) and time.monotonic() < stop:
            time.sleep(0.2)
        assert proc.returncode == 143, log.read_text()[-2000:]
        assert not any(alive(pid) for pid in servers), "its server was left running"
        assert "serve_bench: stopped by SIGTERM; no figures were kept" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _child_serve(entry: Path, parent: int) -> bool:
    """Whether /proc/PID is a `serve` command started by `parent`."""
    try:
        stat = (entry / "stat").read_text()
        cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent and " serve " in cmdline
