"""benchmarks/api_overhead.py: the public API's call timed against a bare replay of the graph runs it made."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "api_overhead.py"
LINE = re.compile(r"^(greedy|beam \d+) b(\d+): bare (\d+) run\(s\) \d+ us \(p10 \d+\) \| API \d+ us \(p10 \d+\) \| "
                  r"API adds -?\d+ us \(p10 -?\d+\), [\d.]+x$")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--rounds", "1", "--calls", "2"],
                          capture_output=True, text=True, timeout=300)


def cases(stdout: str) -> list[tuple[str, int, int]]:
    """(strategy, batch, bare runs) of every case line; every line after the header must be one."""
    lines = stdout.strip().splitlines()[1:]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    return [(m[1], int(m[2]), int(m[3])) for m in matches]


def test_one_call_graphs_replay_one_run_and_a_step_loop_one_per_step(transformer_export, recurrent_export):
    done = run(str(transformer_export.path), "--source-len", "3", "--target-len", "4", "--batch", "1", "--batch", "3")
    assert done.returncode == 0, done.stderr
    assert "transformer d_model 8" in done.stdout.splitlines()[0]
    assert cases(done.stdout) == [("greedy", 1, 1), ("beam 5", 1, 1), ("greedy", 3, 1), ("beam 5", 3, 1)]
    done = run(str(recurrent_export.path), "--source-len", "3", "--target-len", "4", "--beam", "2")
    assert done.returncode == 0, done.stderr
    assert cases(done.stdout) == [("beam 2", 1, 5)]  # a recurrent beam search: the encoder, then a call per step


def test_a_point_model_replays_its_encoder_and_greedy_loop(exports):
    done = run(str(exports["dot"].path), "--source-len", "4", "--target-len", "3", "--beam", "5")
    assert done.returncode == 0, done.stderr
    assert cases(done.stdout) == [("greedy", 1, 2)]  # points decode greedily: --beam does not apply


def test_a_directory_that_is_not_an_export_is_refused_in_one_line(tmp_path):
    done = run(str(tmp_path))
    assert done.returncode == 1 and "no manifest found" in done.stderr and "Traceback" not in done.stderr
