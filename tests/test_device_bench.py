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


def test_bad_inputs_are_refused_by_name_before_anything_is_timed(transformer_export, tmp_path):
    """One line each, no traceback: 2 for a bad option, 1 for an input the benchmark cannot use."""
    model = transformer_export.path
    (tmp_path / "taken.json").write_text("{}")
    cases = [
        (["artifacts/squares"], 1, "MODEL_DIR artifacts/squares: a points model; this benchmark times token models"),
        ([ROOT / "README.md"], 1, "expected a directory written by `seq2onnx export`, got a file"),
        ([tmp_path / "none"], 1, "got nothing there"),
        (["artifacts/dates", "--rounds", "0"], 2, "--rounds: expected 1 or more, got 0"),
        (["artifacts/dates", "--warmup", "-1"], 2, "--warmup: expected 0 or more, got -1"),
        (["artifacts/dates", "--beam", "0"], 2, "expected batches >= 1 and beams from 1 to 256"),
        (["artifacts/dates", "--beam", "1", "300"], 2, "got [1] and [1, 300]"),
        ([model, "--tokens", "5000"], 1, "--tokens 5000: max_decoding_length: 5000 is more than"),
        ([model, "--source-tokens", "5000"], 1, "--source-tokens 5000: texts[0]:"),
        (["artifacts/dates", "--json", tmp_path / "no" / "x.json"], 2, "does not exist; create it first"),
        (["artifacts/dates", "--json", tmp_path], 2, "is a directory; expected a file name"),
        (["artifacts/dates", "--json", tmp_path / "taken.json"], 1, "a file already exists there; pass --force"),
    ]
    for args, code, says in cases:
        done = run(args[0], *QUICK, "--batch", "1", "--beam", "1", *args[1:])  # the case's options last: they win
        assert done.returncode == code and says in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert " ms  x" not in done.stdout, args  # refused before any case was timed
    assert (tmp_path / "taken.json").read_text() == "{}"


def test_no_warmup_still_decodes_once_for_the_agreement(tmp_path):
    done = run("artifacts/dates", *QUICK, "--warmup", "0", "--batch", "2", "--beam", "1", "--json", tmp_path / "x.json")
    assert done.returncode == 0, done.stderr
    assert all(row["agree"] == 1.0 for row in json.loads((tmp_path / "x.json").read_text())["cases"]["greedy b2"].values())


@pytest.mark.skipif("cuda" in DEVICES, reason="CUDA works here")
def test_cuda_without_cuda_is_a_clear_error():
    done = run("artifacts/dates", "--rounds", "1")
    assert done.returncode == 1 and done.stderr.startswith("error: provider 'cuda'"), done.stderr
    assert done.stderr.strip().endswith("; or pass --device cpu")
