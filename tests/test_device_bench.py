"""benchmarks/device_bench.py, on the CPU (--device cpu): every side of every model timed, agreeing, and refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.devices import DEVICES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_bench.py"
QUICK = ("--device", "cpu", "--rounds", "2", "--warmup", "1", "--tokens", "3", "--source-tokens", "4")


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_every_side_of_every_model_is_timed_and_agrees(transformer_export, tmp_path):
    out = tmp_path / "sides.json"
    done = run(transformer_export.path, "artifacts/dates", "artifacts/dates", *QUICK, "--batch", "1", "3",
               "--beam", "1", "2", "--json", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and list(report["cases"]) == ["greedy b1", "beam 2 b1", "greedy b3", "beam 2 b3"]
    common = ["cpu bound", "cpu unbound", "cpu step loop"]
    rest = ["cpu 1 thread", "cpu default threads"]
    want = ([f"model {s}" for s in common + ["cpu plain graphs"] + rest]  # only the transformer has fast graphs
            + [f"dates#{i} {s}" for i in (1, 2) for s in common + rest])
    for case, rows in report["cases"].items():
        assert list(rows) == want, case
        assert rows[want[0]]["ratio"] == 1.0
        assert all(row["median_ms"] > 0 and row["agree"] == 1.0 for row in rows.values()), (case, rows)
    assert done.stdout.count(" ms  x") == 4 * len(want)


def test_a_point_model_and_bad_numbers_are_refused():
    point = run("artifacts/squares", *QUICK)
    assert point.returncode != 0 and "squares: a points model; this benchmark times token models" in point.stderr
    zero = run("artifacts/dates", *QUICK[:2], "--rounds", "0")
    assert zero.returncode == 2 and "--rounds: expected a positive number, got 0" in zero.stderr
    beam = run("artifacts/dates", *QUICK, "--beam", "0")
    assert beam.returncode == 2 and "--batch and --beam: expected numbers >= 1" in beam.stderr


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA works here")
def test_cuda_without_cuda_is_a_clear_error():
    done = run("artifacts/dates", "--rounds", "1")
    assert done.returncode == 2 and done.stderr.startswith("error: provider 'cuda'"), done.stderr
