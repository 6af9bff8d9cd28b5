"""benchmarks/loop_graph_ab.py: two exports of one checkpoint, checked to decode the same, then timed side by side;
exports of different models, or a graph one of them lacks, are refused by name."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "loop_graph_ab.py"


def run(*args: str, sessions: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--rounds", "1", "--calls", "3", "--sessions",
                           str(sessions)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("graph", "extra"), [("fast_beam", ["--beam", "3"]), ("wide_greedy", ["--batch", "5"]),
                                              ("greedy_loop", ["--free"])])
def test_two_exports_of_one_model_are_timed_side_by_side(transformer_export, tmp_path, graph, extra):
    copy = tmp_path / "copy"
    shutil.copytree(transformer_export.path, copy)
    done = run(str(transformer_export.path), str(copy), "--graph", graph, "--steps", "6", "--source-len", "6", *extra)
    assert done.returncode == 0, done.stderr
    assert "same ids" in done.stdout and "after / before" in done.stdout


def test_after_can_time_another_graph_of_the_same_family(transformer_export):
    """The folded body moved from fast_greedy's If to fold_greedy.onnx: --after-graph times one against the other;
    graphs that take other inputs are refused."""
    path = str(transformer_export.path)
    for graph, other, extra in (("fast_greedy", "fold_greedy", []), ("fast_beam", "fold_beam", ["--beam", "2"])):
        done = run(path, path, "--graph", graph, "--after-graph", other, "--steps", "4", "--source-len", "3", *extra)
        assert done.returncode == 0, done.stderr
        assert f"{graph} ({graph}.onnx against {other}.onnx)" in done.stdout and "same ids" in done.stdout
    done = run(path, path, "--graph", "fold_greedy", "--batch", "65", "--source-len", "8", "--steps", "2")
    assert done.returncode == 0 and "note: the runtime sends fold_greedy calls of at most" in done.stdout
    assert "this one has 65 x 8 = 520" in done.stdout  # past the bound (512): timed, but said
    done = run("artifacts/dates", "artifacts/dates", "--graph", "fold_greedy")
    assert done.returncode == 2 and "has no fold_greedy.onnx (folded graphs are written only for" in done.stderr
    done = run(path, path, "--graph", "fast_greedy", "--after-graph", "fold_beam")
    assert done.returncode == 2 and "--after-graph fold_beam does not take --graph fast_greedy's inputs" in done.stderr
    assert "pick one of fast_greedy, fold_greedy, wide_greedy" in done.stderr


def test_a_point_model_runs_its_own_encoder_first(exports, tmp_path):
    path = exports["dot"].path
    done = run(str(path), str(path), "--graph", "greedy_loop", "--steps", "5", "--source-len", "4")
    assert done.returncode == 0, done.stderr
    assert "greedy_loop (greedy_loop.onnx), batch 1, 5 steps" in done.stdout


def test_exports_of_different_models_or_without_the_graph_are_refused(transformer_export, exports):
    done = run(str(transformer_export.path), str(exports["dot"].path), "--graph", "greedy_loop")
    assert done.returncode != 0 and "exports of different models" in done.stderr
    assert "kind 'tokens' vs 'points'" in done.stderr and "ModelSpec(" not in done.stderr  # the fields that differ
    done = run(str(transformer_export.path), str(exports["dot"].path.parent), "--graph", "greedy_loop")
    assert done.returncode == 1 and "no manifest found" in done.stderr and "Traceback" not in done.stderr
    done = run(str(exports["dot"].path), str(exports["dot"].path), "--graph", "fast_beam")
    assert done.returncode != 0 and "has no fast_beam.onnx" in done.stderr
    done = run(str(transformer_export.path), str(transformer_export.path), "--graph", "fast_greedy", "--steps", "99")
    assert done.returncode != 0 and "must be at most this transformer's max_positions" in done.stderr
    done = run(str(transformer_export.path), str(transformer_export.path), "--graph", "fast_beam", "--beam", "33")
    assert done.returncode == 2 and "1<=x<=32" in done.stderr and "Traceback" not in done.stderr  # MAX_GRAPH_BEAM


def test_the_same_export_given_twice_is_timed_as_two_sides(transformer_export, monkeypatch):
    """Keyed by path, both sides' times once went into one list: an exact 1.000 by construction."""
    import importlib.util

    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its siblings, as when run from there
    spec = importlib.util.spec_from_file_location("loop_graph_ab", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls: list[int] = []

    def side(i: int):
        def run() -> None:
            calls.append(i)
        return run

    times = module.interleaved([side(0), side(1)], 4)
    assert calls.count(0) == calls.count(1) == 4 and [len(t) for t in times] == [4, 4]
    # each side goes first in every other turn (A B, B A, ...): neither always runs first
    assert calls == [0, 1, 1, 0, 0, 1, 1, 0]
    done = run(str(transformer_export.path), str(transformer_export.path), "--graph", "fast_greedy", "--steps", "3",
               "--source-len", "5", sessions=3)  # rounded up to 4 a side: 3 calls -> 1 each, 4 a side
    assert done.returncode == 0, done.stderr
    assert "4 interleaved calls per side per round, 1 each in 4 sessions a side (--calls 3 rounded up)" in done.stdout
    assert done.stdout.count("sessions' medians") == 1
    done = run(str(transformer_export.path), str(transformer_export.path), "--graph", "fast_greedy", "--steps", "3",
               "--source-len", "5", sessions=1)  # one a side, as the tool timed before --sessions
    assert done.returncode == 0, done.stderr
    assert "3 interleaved calls per side per round, 3 each in 1 session a side\n" in done.stdout


def test_an_altered_graph_is_refused_in_one_line(transformer_export, tmp_path):
    copy = tmp_path / "altered"
    shutil.copytree(transformer_export.path, copy)
    graph = copy / "fast_greedy.onnx"
    graph.write_bytes(graph.read_bytes()[:1000])  # truncated
    done = run(str(transformer_export.path), str(copy), "--graph", "fast_greedy", "--steps", "3", "--source-len", "5")
    assert done.returncode == 1, done.stdout
    assert "does not match the manifest" in done.stderr and "Traceback" not in done.stderr
