"""benchmarks/denormal_bench.py: decodes with denormals flushed against IEEE denormals, side by side."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.devices import X86_LINUX
from support.processes import assert_refused_in_one_line

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "denormal_bench.py"
LINE = re.compile(r"^(greedy|beam \d+) b(\d+): flushed [\d.]+ ms \| IEEE [\d.]+ ms \| ratio [\d.]+ \| (.+?)"
                  r"( \(one row: neither side flushes\))?$")
SOFTMAX = re.compile(r"^softmax alone \(16, 4, 4, 52\), a third of it -inf: IEEE [\d.]+ us, flushed [\d.]+ us; "
                     r"unmasked: IEEE [\d.]+ us, flushed [\d.]+ us$")
pytestmark = pytest.mark.skipif(not X86_LINUX, reason="denormals are flushed on x86-64 Linux only")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--repeats", "2"],
                          capture_output=True, text=True, timeout=300)


def cases(stdout: str) -> list[tuple[str, int, str]]:
    """(strategy, batch, agreement) of every case line, after the CPU, the model and the softmax-alone lines; a
    case of one row (flushed on neither side) says so, and only such a case."""
    lines = stdout.strip().splitlines()
    assert lines[0].split(",")[0] and "ratio = flushed / IEEE" in lines[1] and SOFTMAX.match(lines[2]), lines
    matches = [LINE.match(line) for line in lines[3:]]
    assert all(matches), lines
    for m in matches:
        rows = int(m[2]) * (1 if m[1] == "greedy" else int(m[1].split()[1]))
        assert bool(m[4]) == (rows == 1), m[0]
    return [(m[1], int(m[2]), m[3]) for m in matches]


def test_every_case_decodes_the_same_ids_both_ways(transformer_export):
    done = run(str(transformer_export.path), "--source-len", "3", "--target-len", "4", "--batch", "1", "--batch", "3",
               "--beam", "1", "--beam", "2")
    assert done.returncode == 0, done.stderr
    assert cases(done.stdout) == [("greedy", 1, "same ids"), ("beam 2", 1, "same ids"), ("greedy", 3, "same ids"),
                                  ("beam 2", 3, "same ids")]


def test_a_point_model_reports_its_largest_difference(exports):
    done = run(str(exports["dot"].path), "--source-len", "4", "--target-len", "3", "--batch", "2")
    assert done.returncode == 0, done.stderr
    ((strategy, batch, agreement),) = cases(done.stdout)
    assert (strategy, batch) == ("greedy", 2) and re.fullmatch(r"max point diff \d\.\d\de[-+]\d+", agreement)


@pytest.mark.parametrize(("args", "says"), [
    ([], "no manifest found"),
    (["--beam", "2"], "--beam: {points} is a point model, which decodes greedily"),
    (["--target-len", "9"], "'--target-len': 9: {tokens} is a transformer with max_positions 8"),
    (["--batch", "0"], "'--batch': 0 is not in the range"),
])
def test_bad_options_are_refused_in_one_line_before_any_work(tmp_path, exports, transformer_export, args, says):
    points, tokens = exports["dot"].path, transformer_export.path
    target = tmp_path if not args else points if "--beam" in args else tokens
    assert_refused_in_one_line(run(str(target), *args), says.format(points=points, tokens=tokens))
