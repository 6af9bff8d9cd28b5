"""benchmarks/api_overhead.py: the public API's call timed against a bare replay of the graph runs it made."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import assert_refused_in_one_line

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "api_overhead.py"
LINE = re.compile(r"^(greedy|beam \d+) b(\d+): bare (\d+) run\(s\) \d+ us \(p10 \d+\) \| API (\d+) us \(p10 \d+\) \| "
                  r"API adds -?\d+ us \(p10 -?\d+\), [\d.]+x \| its Python alone (\d+) us \(p10 \d+\)$")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--repeats", "2"],
                          capture_output=True, text=True, timeout=300)


def cases(stdout: str) -> list[tuple[str, int, int]]:
    """(strategy, batch, bare runs) of every case line; every line after the header must be one."""
    lines = stdout.strip().splitlines()[1:]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines  # (no timing is compared: two repeats of each, on a shared machine)
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
    done = run(str(exports["dot"].path), "--source-len", "4", "--target-len", "3")
    assert done.returncode == 0, done.stderr
    assert cases(done.stdout) == [("greedy", 1, 2)]  # points decode greedily


def test_a_fixed_length_model_gets_the_source_length_it_reads(tmp_path_factory):
    """Defaults as `seq2onnx bench`'s: the tutorial model reads 10 tokens with its </s>, so texts of 9."""
    from export.api import export_model

    from support.foreign import trained

    path = export_model(trained("tutorial").adapter(), tmp_path_factory.mktemp("tutorial") / "model")
    done = run(str(path), "--beam", "1", "--target-len", "3")
    assert done.returncode == 0, done.stderr
    assert "source 9, target 3" in done.stdout.splitlines()[0] and cases(done.stdout) == [("greedy", 1, 2)]


@pytest.mark.parametrize(("args", "says"), [
    ([], "no manifest found"),
    (["--beam", "2"], "--beam: {points} is a point model, which decodes greedily"),
    (["--source-len", "8"], "'--source-len': 8 tokens: {tokens} reads at most 7 source tokens"),
    (["--target-len", "9"], "'--target-len': 9: {tokens} is a transformer with max_positions 8"),
    (["--threads", "999"], "'--threads': expected 1.."),
    (["--batch", "0"], "'--batch': 0 is not in the range"),
])
def test_bad_options_are_refused_in_one_line_before_any_work(tmp_path, exports, transformer_export, args, says):
    points, tokens = exports["dot"].path, transformer_export.path
    target = tmp_path if not args else points if "--beam" in args else tokens
    assert_refused_in_one_line(run(str(target), *args), says.format(points=points, tokens=tokens))
