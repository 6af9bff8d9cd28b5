"""The benchmarks' --plot files follow the CLI's rule (runtime.destination.check_output_file): refused before any
work when the folder is missing, the suffix is not .png or a file is there without --force, and the user's file is
left as it was; with --force the plot replaces it whole."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOAK = [str(ROOT / "benchmarks" / "soak_bench.py"), str(ROOT / "artifacts" / "dates"), "--decodes", "40",
        "--warmup", "5", "--sample-every", "10"]
STEP = [str(ROOT / "benchmarks" / "transformer_step_bench.py")]


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("script", [SOAK, STEP], ids=["soak_bench", "transformer_step_bench"])
@pytest.mark.parametrize(("plot", "says"), [
    ("taken.png", "a file already exists there; pass --force"),
    ("missing/x.png", "does not exist; create it first"),
    ("chart.jpg", "expected a file name ending in .png"),
])
def test_a_bad_plot_path_is_refused_before_any_work(tmp_path, script, plot, says):
    (tmp_path / "taken.png").write_text("mine")
    done = run([*script, "--plot", str(tmp_path / plot)])
    assert done.returncode == 2 and says in done.stderr and "'--plot'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout  # nothing was measured
    assert (tmp_path / "taken.png").read_text() == "mine"


def test_force_replaces_the_plot_whole(tmp_path):
    plot = tmp_path / "rss.png"
    plot.write_text("mine")
    done = run([*SOAK, "--plot", str(plot), "--force"])
    assert done.returncode == 0, done.stderr
    assert plot.read_bytes()[:4] == b"\x89PNG" and sorted(p.name for p in tmp_path.iterdir()) == ["rss.png"]
