"""benchmarks/transformer_floor.py: a batch-1 decode split into its fixed part and a further step for both engines, and
the greedy step's kernels counted and timed in bare loops."""
from __future__ import annotations

import math
import re
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
    from transformer_floor import census, fixed_and_step, kernel_costs, main, optimized_body  # noqa: E402
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
    assert all(costs["Loop iteration", rows] > 0 for rows in (1, 3))


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
    (["--lengths", "0,2,3"], 2, "expected integers >= 1, got '0,2,3'"),
    (["--lengths", "1,two,3"], 2, "expected comma-separated integers, got '1,two,3'"),
    (["--beams", "0"], 2, "expected integers >= 1, got '0'"),
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


def test_a_recurrent_checkpoint_is_refused_by_name(tmp_path):
    from click.testing import CliRunner

    from training.build import build_token_model

    torch.manual_seed(0)
    gru = save_token_checkpoint(tmp_path / "gru", build_token_model(toy_token_spec(hidden_dim=8, embedding_dim=6)))
    result = CliRunner().invoke(main, ["--checkpoint", str(gru)])
    assert result.exit_code == 1 and "got a recurrent token model" in result.output, result.output
