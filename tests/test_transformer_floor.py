"""benchmarks/transformer_floor.py: a batch-1 decode split into its fixed part and a further step for both engines, and
the greedy step's kernels counted and timed in bare loops."""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "transformer_floor.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import transformer_floor  # noqa: E402
    from transformer_floor import (  # noqa: E402
        census,
        fixed_and_step,
        kernel_costs,
        kernel_table,
        main,
        optimized_body,
        step_estimate,
    )
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

import onnx  # noqa: E402

from support.models import save_token_checkpoint, toy_token_spec  # noqa: E402

SIZES = dict(arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2, max_positions=32)


def checkpoint(out: Path, **fields: object) -> Path:
    from training.build import build_token_model

    torch.manual_seed(0)
    return save_token_checkpoint(out, build_token_model(toy_token_spec(**{**SIZES, **fields})))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_fixed_is_the_shortest_length_and_a_step_the_slope_from_two_up():
    lengths = [1, 2, 5, 10]
    fixed, step = fixed_and_step(lengths, [150.0, 114.0, 135.0, 170.0])  # from 2 up: 100 + 7 T
    assert fixed == 150.0 and step == pytest.approx(7.0)


def test_the_census_counts_the_optimized_greedy_body_and_its_constant_products(transformer_export, tmp_path):
    graph = transformer_export.path / "fold_greedy.onnx"
    kinds, shapes = census(optimized_body(graph, tmp_path), onnx.load(graph).graph)
    assert kinds["Attention"] == 2  # a fused self-attention a layer
    assert kinds["TopK"] == 1 and sum(kinds.values()) > 20
    d_model = 8  # the fixture's
    assert shapes and all(d_model in shape for shape in shapes), shapes  # each product reads or writes the stream
    assert len(shapes) <= sum(kinds[k] for k in ("MatMul", "Gemm", "FusedMatMul"))


def test_every_kind_is_timed_at_every_row_count():
    spec = toy_token_spec(**{**SIZES, "d_model": 8})
    costs = kernel_costs(spec, [(8, 16), (16, 8), (8, 16)], [1, 3], steps=2, repeats=2)
    names = {"product 8x16", "product 16x8", "Attention", "LayerNormalization", "Add", "Softmax", "Relu",
             "Loop iteration"}
    assert set(costs) == {(name, rows) for name in names for rows in (1, 3)}
    assert all(math.isfinite(c) for c in costs.values())  # (not compared: two runs each on a shared machine)


def test_a_loop_iteration_is_the_difference_of_two_trip_counts_not_a_whole_run_over_its_steps():
    # a run of a 1-iteration Loop costs ~10 us here (session.run, feeds, the Loop's set-up); an empty iteration ~1 us:
    # the whole run over --steps read 47 us a step at --steps 1 and 30 at 20, the difference reads alike at both
    spec = toy_token_spec(**{**SIZES, "d_model": 8})
    costs = kernel_costs(spec, [(8, 16)], [1], steps=1, repeats=40)
    assert costs["Loop iteration", 1] < 5.0, costs


def test_a_cost_below_zero_is_marked_as_noise_and_counts_as_zero_in_the_step():
    from collections import Counter

    kinds = Counter({"MatMul": 2, "Attention": 1, "LayerNormalization": 1, "Add": 1, "Softmax": 0, "Relu": 0,
                     "TopK": 1})
    shapes = [(8, 16), (16, 8)]
    costs = {(name, rows): cost for rows in (1, 3) for name, cost in (
        ("product 8x16", 2.0), ("product 16x8", -0.5), ("Attention", 5.0), ("LayerNormalization", 1.0),
        ("Add", -0.25), ("Softmax", 1.0), ("Relu", 1.0), ("Loop iteration", 1.5))}
    estimate, rest = step_estimate(kinds, shapes, costs)
    assert estimate == pytest.approx(2.0 + 0 + 5.0 + 1.0 + 0 + 1.5)
    assert rest == Counter({"TopK": 1})
    table = kernel_table("g.onnx", kinds, shapes, costs, [1, 3], steps=1, repeats=1)
    assert "| product 16x8 | 1 | -0.50 (noise) | -0.50 (noise) | - |" in table
    assert "| product 8x16 | 1 | 2.00 | 2.00 | 1.00 |" in table
    assert "within the run-to-run spread of 1 run; it counts as 0 below; raise --kernel-repeats" in table
    assert "a bare Loop of 1 iteration, medians of 1 run (us)" in table


def test_a_toy_checkpoint_is_timed_through_both_parts(tmp_path):
    done = run("--checkpoint", str(checkpoint(tmp_path / "tf")), "--source", "the cat sat", "--lengths", "1,2,3",
               "--repeats", "2", "--kernel-repeats", "2", "--steps", "2", "--rows", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "source 'the cat sat' (3 tokens + </s>)" in out
    for beam in (1, 5):
        table = out.split(f"beam {beam}, batch 1:")[1].split("\n\n")[0]
        assert [line.split(" | ")[0] for line in table.splitlines()[3:]] == [
            "| 1", "| 2", "| 3", "| fixed (T = 1)", "| a further step (slope, T >= 2)"]
    assert re.search(r"the greedy step's kernels \(fold_greedy\.onnx's loop body .*\): \d+ a step: ", out)
    assert "| kernel | in a step | 1 row | 3 rows | 3 rows / 1 row |" in out
    assert "| Attention | 2 |" in out and "| Loop iteration | 1 |" in out
    assert re.search(r"a greedy step at these costs: [\d.]+ us .*; the step measured in part 1 \(runs, beam 1\): "
                     r"-?[\d.]+ us", out)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--lengths", "1,2"], 2, "expected at least two lengths of 2 or more"),
    (["--lengths", "2,3,5"], 2, "expected 1 among the lengths (the fixed part is a call decoding one token), got '2,3,5'"),
    (["--lengths", "0,2,3"], 2, "expected integers >= 1, got '0,2,3'"),
    (["--lengths", "1,two,3"], 2, "expected comma-separated integers, got '1,two,3'"),
    (["--beams", "0"], 2, "expected integers >= 1, got '0'"),
    (["--beams", "300"], 2, "expected integers up to 256, got 300"),
    (["--beams", "1,,5"], 2, "expected comma-separated integers, got '1,,5' (an empty item)"),
    (["--repeats", "0"], 2, "0 is not in the range x>=1"),
    (["--rows", "1"], 2, "1 is not in the range x>=2"),
    (["--lengths", "1,2,33"], 2, "33 is more than this transformer's max_positions 32"),
    (["--source", ""], 2, "Invalid value for '--source': texts[0]: expected a non-empty string, got ''"),
    (["--source", "the cat " * 20], 2, "texts[0]: 41 tokens with the closing </s>, more than this transformer's max_positions 32"),
])
def test_bad_options_are_refused_in_one_line_before_the_export(tmp_path, monkeypatch, args, code, says):
    from click.testing import CliRunner

    exported = []
    monkeypatch.setattr(transformer_floor, "export_model", lambda *a, **k: exported.append(a))
    result = CliRunner().invoke(main, ["--checkpoint", str(checkpoint(tmp_path / "tf")), *args])
    assert result.exit_code == code and says in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    assert not exported


def test_a_source_mostly_unknown_to_the_vocabulary_is_timed_with_a_warning(tmp_path, monkeypatch):
    from click.testing import CliRunner

    class Exported(Exception):
        pass

    def export_model(*args: object, **kwargs: object) -> None:
        raise Exported  # the source checks are done by then: stop here

    monkeypatch.setattr(transformer_floor, "export_model", export_model)
    tf = checkpoint(tmp_path / "tf")
    result = CliRunner().invoke(main, ["--checkpoint", str(tf), "--source", "zebra quokka two"])
    assert isinstance(result.exception, Exported), result.output
    assert ("warning: --source: 2 of its 3 tokens are not in the checkpoint's source vocabulary (whitespace tokens; "
            "they read as <unk>)") in result.output
    result = CliRunner().invoke(main, ["--checkpoint", str(tf), "--source", "two is nine"])
    assert isinstance(result.exception, Exported) and "warning" not in result.output, result.output


def test_sigterm_stops_it_in_order_and_removes_its_temporary_directory(tmp_path):
    """A real SIGTERM mid-timing (Ctrl-C's exit 130 is tested in-process in test_ct2.py: the same command class)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    child = subprocess.Popen([sys.executable, str(SCRIPT), "--checkpoint", str(checkpoint(tmp_path / "tf")),
                              "--source", "two is nine", "--repeats", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(scratch)})
    try:
        for line in child.stderr:  # the export is done and the timing under way
            if line.startswith("timing beam 1"):
                break
        assert len(list(scratch.glob("transformer-floor-*"))) == 1
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 143, err
    assert "Error: stopped by SIGTERM; no figures were kept and the temporary files are removed" in err
    assert "Traceback" not in err
    assert not list(scratch.glob("transformer-floor-*"))  # (onnxruntime's telemetry leaves a .ses file there)


def test_a_recurrent_checkpoint_is_refused_by_name(tmp_path):
    from click.testing import CliRunner

    from training.build import build_token_model

    torch.manual_seed(0)
    gru = save_token_checkpoint(tmp_path / "gru", build_token_model(toy_token_spec(hidden_dim=8, embedding_dim=6)))
    result = CliRunner().invoke(main, ["--checkpoint", str(gru)])
    assert result.exit_code == 1 and "got a recurrent token model" in result.output, result.output
