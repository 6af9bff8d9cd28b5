"""The benchmark tools the README documents stop as `seq2onnx` commands do (exit 130 on Ctrl-C, 143 on SIGTERM, one
line, no traceback) and say a model the runtime refuses in one line; search_bench runs with its defaults."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.processes import assert_refused_in_one_line, default_stops

ROOT = Path(__file__).resolve().parents[1]
DATES, DATES_CHECKPOINT, SQUARES = (ROOT / "artifacts" / name for name in ("dates", "dates-checkpoint", "squares"))


def tool(name: str, *args: object) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *map(str, args)]


@pytest.mark.parametrize(("sig", "code", "says"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "stopped by SIGTERM")])
@pytest.mark.parametrize("name", ["api_overhead", "recurrent_floor"])
def test_a_signal_stops_a_tool_with_its_exit_code_and_one_line(name: str, sig: int, code: int, says: str) -> None:
    with subprocess.Popen(tool(name, DATES, "--repeats", "1000000"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, preexec_fn=default_stops) as proc:
        time.sleep(6)  # loaded (~1 s) and timing: a million repeats would take hours
        assert proc.poll() is None
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and f"Error: {says}; no figures were kept" in stderr, stderr


@pytest.mark.parametrize(("args", "says"), [
    (tool("soak_bench", DATES_CHECKPOINT, "--decodes", "60"), "is a training checkpoint, not an export"),
    (tool("search_bench", "--rounds", "1", "--steps", "3", "--model", SQUARES), "is a point model"),
])
def test_a_model_the_runtime_refuses_is_one_line(args: list[str], says: str) -> None:
    assert_refused_in_one_line(subprocess.run(args, capture_output=True, text=True, timeout=300), says)


def test_search_bench_runs_with_its_defaults() -> None:
    """Its old-search side drives the frozen reference through runtime.tokens, whose keywords grow over time."""
    done = subprocess.run(tool("search_bench", "--rounds", "1", "--steps", "2", "--json"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cases = {row["case"] for row in json.loads(done.stdout)["rows"]}
    assert {"overhead beam 1", "gru beam 1", "gru beam 64"} <= cases, cases
