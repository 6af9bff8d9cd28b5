"""`seq2onnx bench`: real subprocess runs on tiny grids (the JSON's every cell, the tables, the plot), PyTorch eager
against the shipped checkpoints, runs without torch, the hand-written Identity graph, fixed-length texts, and the
bench rows of the reliability table (bad grid values and files refused with one line and the right exit code)."""
from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from runtime.bench import fixed_length_text, identity_graph
from runtime.sessions import max_threads
from runtime.vocab import SPECIAL_TOKENS, Vocabulary

from support.devices import DEVICES
from support.reliability import (
    BAD_INPUT,
    ROOT,
    SHIPPED_CHECKPOINT,
    SHIPPED_MODEL,
    USAGE,
    Case,
    assert_refused,
    case,
    edit_json,
    workspace_fixtures,
    write,
)

SHIPPED_TOKENS = ROOT / "artifacts" / "dates"
SHIPPED_TOKEN_CHECKPOINT = ROOT / "artifacts" / "dates-checkpoint"
THREADS = [1, 2] if max_threads() >= 2 else [1]
QUICK = ("--repeats", "2", "--warmup", "1", *itertools.chain.from_iterable(("--threads", str(t)) for t in THREADS))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A child interpreter where `import torch` fails, as on a runtime-only install (as tests/test_cli.py does).
NO_TORCH = "import sys; sys.modules['torch'] = None; from cli.main import main; sys.argv[0] = 'seq2onnx'; main()"


def bench(*args: Any, cwd: Path | None = None, no_torch: bool = False) -> subprocess.CompletedProcess:
    """`seq2onnx bench ARGS` in a subprocess of this interpreter."""
    prefix = [sys.executable, "-c", NO_TORCH] if no_torch else [sys.executable, "-m", "cli"]
    return subprocess.run([*prefix, "bench", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)


def grid_args(batches: list[int], sources: list[int], targets: list[int], beams: list[int] = ()) -> list[str]:
    """--batch/--source-len/--target-len/--beam, each value repeated as its own option."""
    pairs = [("--batch", batches), ("--source-len", sources), ("--target-len", targets), ("--beam", beams)]
    return [item for flag, values in pairs for v in values for item in (flag, str(v))]


def check_timing(stats: dict[str, Any], batch: int, tokens: int) -> None:
    """Positive medians, p90 >= median, rates from the median, and exactly the tokens asked for."""
    assert stats["median_ms"] > 0 and stats["p90_ms"] >= stats["median_ms"], stats
    assert stats["sequences_per_s"] == pytest.approx(batch / stats["median_ms"] * 1e3, rel=1e-9)
    assert stats["tokens"] == tokens, stats  # min = max decoding length: every sequence runs exactly target_len
    assert stats["tokens_per_s"] == pytest.approx(tokens / stats["median_ms"] * 1e3, rel=1e-9)
    assert stats["repeats"] == 2


def check_doc(doc: dict[str, Any], batches: list[int], sources: list[int], targets: list[int], beams: list[Any],
              eager: bool, loops: tuple[str, ...] = ("step",), beam_graph: bool = False) -> None:
    """Every grid cell once (the fused loop greedy only, unless the export has a beam search graph), each well
    formed; speed-ups are torch / ort, per cell and with each side at its best thread count."""
    assert doc["grid"]["loop"] == list(loops)
    expected = {cell for cell in itertools.product(["cpu"], THREADS, loops, batches, sources, targets, beams)
                if cell[2] == "step" or (cell[6] or 1) == 1 or beam_graph}
    keys = [(c["provider"], c["threads"], c["loop"], c["batch"], c["source_len"], c["target_len"], c["beam"])
            for c in doc["cells"]]
    assert sorted(keys, key=str) == sorted(expected, key=str)
    for c in doc["cells"]:
        check_timing(c["ort"], c["batch"], c["batch"] * c["target_len"])
        fused = 1 if beam_graph else 2  # a transformer's fast graphs hold the encoder: one call
        assert c["floor"]["calls"] == (fused if c["loop"] == "fused" else 1 + c["target_len"])
        assert c["floor"]["p90_ms"] >= c["floor"]["median_ms"] > 0
        assert c["providers"][0] == "CPUExecutionProvider"
        if not eager:
            assert c["torch"] is None and c["speedup"] is None
            continue
        check_timing(c["torch"], c["batch"], c["batch"] * c["target_len"])
        assert c["speedup"] == pytest.approx(c["torch"]["median_ms"] / c["ort"]["median_ms"], rel=1e-9)
    assert len(doc["best"]) == (len(expected) // len(THREADS) if eager else 0)
    for row in doc["best"]:
        same = [c for c in doc["cells"]
                if all(c[k] == row[k] for k in ("loop", "batch", "source_len", "target_len", "beam"))]
        assert len(same) == len(THREADS)
        assert row["ort_median_ms"] == min(c["ort"]["median_ms"] for c in same)
        assert row["torch_median_ms"] == min(c["torch"]["median_ms"] for c in same)
        assert row["speedup"] == pytest.approx(row["torch_median_ms"] / row["ort_median_ms"], rel=1e-9)


def fused_loops(model_dir: Path) -> tuple[str, ...]:
    """The loops `--loop auto` measures: the step loop, and the greedy loop graph where the export has one."""
    from runtime.model import Seq2Seq

    return ("step", "fused") if Seq2Seq.load(model_dir, provider="cpu").has_fused else ("step",)


def test_points_with_checkpoint_json_table_and_plot(tmp_path: Path) -> None:
    write(tmp_path / "old.json", "{}\n")
    grid = ([1, 3], [4], [2, 5])
    result = bench(SHIPPED_MODEL, "--checkpoint", SHIPPED_CHECKPOINT, *grid_args(*grid), *QUICK, "--json", "old.json",
                   "--plot", "latency.png", "--force", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads((tmp_path / "old.json").read_text())
    assert doc["format"] == "seq2onnx-bench/1" and doc["kind"] == "points" and doc["setup"]["torch"]
    check_doc(doc, *grid, [None], eager=True, loops=fused_loops(SHIPPED_MODEL))
    assert all(c["torch"]["decoder"] == "training.points.decode.reference_decode" for c in doc["cells"])
    assert (tmp_path / "latency.png").read_bytes()[:8] == PNG_MAGIC
    assert "speed-up" in result.stdout and "each side at its best thread count" in result.stdout
    # the loop column is onnxruntime's: PyTorch's side read as if it ran a 'fused' loop (found by a fresh walk)
    assert "torch = PyTorch eager's own decode, timed beside each row (loop is onnxruntime's)" in result.stdout
    assert len(result.stdout.splitlines()) >= 2 + len(doc["cells"]) + 2 + len(doc["best"])
    assert result.stderr.count("\n[") + result.stderr.startswith("[") == len(doc["cells"])  # one progress line each
    assert not list(tmp_path.glob(".*.tmp"))


def test_tokens_with_checkpoint_run_exactly_target_len_on_both_sides() -> None:
    grid = ([1, 2], [5], [3], [1, 2])
    result = bench(SHIPPED_TOKENS, "--checkpoint", SHIPPED_TOKEN_CHECKPOINT, *grid_args(*grid), *QUICK, "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # --json -: stdout holds the JSON only
    check_doc(doc, *grid, eager=True, loops=fused_loops(SHIPPED_TOKENS))
    for c in doc["cells"]:
        decoders = {k: c[k]["decoder"] for k in ("torch", "torch_search") if k in c}
        if c["beam"] == 1:  # the model's own greedy loop is the reference; the shared search strategies beside it
            assert decoders == {"torch": "TokenModel.greedy (</s> forbidden)",
                                "torch_search": "torch_steps + runtime.search.greedy_search"}
            check_timing(c["torch_search"], c["batch"], c["batch"] * c["target_len"])
        else:
            assert decoders == {"torch": "torch_steps + runtime.search.beam_search"}


@pytest.mark.parametrize("kind", ["points", "transformer"])
def test_fixture_exports_without_checkpoint(kind: str, exports: Any, transformer_export: Any) -> None:
    # transformer: 7 source tokens + </s> and 8 outputs fill its 8-row position table
    model_dir, grid = ((exports["multihead"].path, ([1, 2], [3], [4], [None])) if kind == "points"
                       else (transformer_export.path, ([2], [3, 7], [8], [1, 3])))
    result = bench(model_dir, *grid_args(*grid[:3], [b for b in grid[3] if b]), *QUICK, "--json", "-")
    assert result.returncode == 0, result.stderr
    check_doc(json.loads(result.stdout), *grid, eager=False, loops=fused_loops(model_dir),
              beam_graph=kind == "transformer")  # a transformer's export holds fast_beam.onnx


def test_runs_without_torch_and_names_the_extra_for_checkpoint(tmp_path: Path) -> None:
    args = (*grid_args([1], [2], [2]), "--repeats", "1", "--warmup", "0", "--threads", "1")
    result = bench(SHIPPED_MODEL, *args, "--json", "-", no_torch=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["setup"]["torch"] is None
    refused = bench(SHIPPED_MODEL, "--checkpoint", SHIPPED_CHECKPOINT, *args, no_torch=True)
    assert refused.returncode == BAD_INPUT and "needs PyTorch" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("pair", ["points", "tokens"])
def test_checkpoint_of_another_model_is_refused(pair: str, exports: Any, transformer_export: Any) -> None:
    model_dir, checkpoint = ((exports["dot"].path, SHIPPED_CHECKPOINT) if pair == "points"
                             else (transformer_export.path, SHIPPED_TOKEN_CHECKPOINT))
    result = bench(model_dir, "--checkpoint", checkpoint, "--batch", "1", "--repeats", "1")
    assert result.returncode == BAD_INPUT, result.stderr
    assert "hold different models" in result.stderr and "Traceback" not in result.stderr
    assert "[1/" not in result.stderr  # refused before any cell ran


def test_identity_graph_is_valid_onnx_and_runs() -> None:
    onnx = pytest.importorskip("onnx")
    model = onnx.load_from_string(identity_graph())
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Identity"]
    session = ort.InferenceSession(identity_graph(), providers=["CPUExecutionProvider"])
    x = np.array([2.5], dtype=np.float32)
    np.testing.assert_array_equal(session.run(["y"], {"x": x})[0], x)


def _bpe() -> Vocabulary:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=60, special_tokens=list(SPECIAL_TOKENS))
    tokenizer.train_from_iterator(["the cat sat on the mat", "a dog ate the hat", "then they met"] * 5, trainer)
    return Vocabulary.from_tokenizer_json(tokenizer.to_str())


@pytest.mark.parametrize("kind", ["char", "whitespace", "subword"])
def test_fixed_length_texts_have_exactly_that_many_tokens(kind: str) -> None:
    texts = ["12 march, 2015", "tuesday 3/3/15 at noon"]
    vocab = _bpe() if kind == "subword" else Vocabulary.build(texts, kind)
    rng = np.random.default_rng(0)
    for length in (1, 2, 7, 40):
        text = fixed_length_text(vocab, length, rng)
        ids = vocab.encode(text, add_eos=False)
        assert len(ids) == length and min(ids) >= len(SPECIAL_TOKENS) and text.strip() == text, (text, ids)


# ---- the reliability rows: (arguments, exit code, fragments of the one Error: line) ------------------------------

def setup_bench_workspace(case_dir: Path) -> None:
    """The shipped point and token models, the point checkpoint, files a run must not replace, a user's folder."""
    shutil.copytree(SHIPPED_MODEL, case_dir / "model")
    shutil.copytree(SHIPPED_TOKENS, case_dir / "tokmodel")
    shutil.copytree(SHIPPED_CHECKPOINT, case_dir / "ckpt", ignore=shutil.ignore_patterns("train_state.pt"))
    shutil.copytree(SHIPPED_MODEL, case_dir / "nofused")  # an export from before the greedy loop graph
    edit_json(case_dir / "nofused" / "manifest.json", lambda m: m["graphs"].pop("greedy_loop.onnx"))
    (case_dir / "nofused" / "greedy_loop.onnx").unlink()
    shutil.copytree(SHIPPED_TOKEN_CHECKPOINT, case_dir / "nanckpt")  # a damaged copy: one weight NaN
    weights = torch.load(case_dir / "nanckpt" / "weights.pt")
    weights["encoder.bridge_h.weight"][0, 0] = float("nan")
    torch.save(weights, case_dir / "nanckpt" / "weights.pt")
    (case_dir / "userdata").mkdir()
    write(case_dir / "userdata" / "notes.txt", "the user's own notes\n")
    write(case_dir / "results.json", "{}\n")
    write(case_dir / "latency.png", b"\x89PNG\r\n\x1a\nmine")


template, workspace = workspace_fixtures("bench_reliability", setup_bench_workspace)


POINTS, TOKENS = ("bench", "model"), ("bench", "tokmodel")
BENCH_CASES: dict[str, Case] = {
    "--batch 0": case(*POINTS, "--batch", "0", code=USAGE, says=("--batch", "0 is not in the range", "1<=x<=4096")),
    "--batch -3": case(*POINTS, "--batch", "-3", code=USAGE, says=("--batch", "-3")),
    "--batch two": case(*POINTS, "--batch", "two", code=USAGE, says=("--batch", "'two' is not a valid integer.")),
    "--batch 1.5": case(*POINTS, "--batch", "1.5", code=USAGE, says=("--batch", "'1.5'")),
    "--source-len 0": case(*POINTS, "--source-len", "0", code=USAGE, says=("--source-len", "0")),
    "--target-len -1": case(*POINTS, "--target-len", "-1", code=USAGE, says=("--target-len", "-1")),
    "--threads 0": case(*POINTS, "--threads", "0", code=USAGE, says=("--threads", "expected 1..", "got 0")),
    "--threads 10000": case(*POINTS, "--threads", "10000", code=USAGE, says=("--threads", "got 10000")),
    "--repeats 0": case(*POINTS, "--repeats", "0", code=USAGE, says=("--repeats", "0")),
    "--warmup -1": case(*POINTS, "--warmup", "-1", code=USAGE, says=("--warmup", "-1")),
    "--provider tpu": case(*POINTS, "--provider", "tpu", code=USAGE, says=("--provider", "'tpu'", "cuda")),
    "--loop sideways": case(*POINTS, "--loop", "sideways", code=USAGE, says=("--loop", "'sideways'", "fused")),
    "--beam on a point model": case(*POINTS, "--beam", "2", code=USAGE, says=("--beam", "point model")),
    "--beam 0": case(*TOKENS, "--beam", "0", code=USAGE, says=("--beam", "0 is not in the range")),
    "--source-len beyond the token limit": case(*TOKENS, "--source-len", "1024", code=USAGE,
                                                says=("--source-len", "1024 tokens", "at most 1023")),
    "--json not .json": case(*POINTS, "--json", "out.txt", code=USAGE, says=("--json", "out.txt", ".json")),
    "--json existing": case(*POINTS, "--json", "results.json", code=BAD_INPUT,
                            says=("--json", "results.json", "already exists", "--force")),
    "--json into a missing directory": case(*POINTS, "--json", "nodir/out.json", code=USAGE,
                                            says=("--json", "does not exist")),
    "--json over the model's vocabulary": case(*TOKENS, "--json", "tokmodel/source_vocab.json", "--force",
                                               code=BAD_INPUT, says=("--json: tokmodel/source_vocab.json: is inside "
                                                                     "the seq2onnx export", "outside it")),
    "--plot into the model": case(*POINTS, "--plot", "model/latency.png", code=BAD_INPUT,
                                  says=("--plot: model/latency.png: is inside the seq2onnx export",)),
    "--plot existing": case(*POINTS, "--plot", "latency.png", code=BAD_INPUT,
                            says=("--plot", "latency.png", "already exists", "--force")),
    "--plot not .png": case(*POINTS, "--plot", "latency.jpg", code=USAGE, says=("--plot", ".png")),
    "--loop fused with beam 5 only": case(*TOKENS, "--loop", "fused", "--beam", "5", code=USAGE,
                                          says=("--loop fused", "beam sizes are [5]", "--beam 1",
                                                "calls its beam step graph a step at a time")),
    "--loop fused without a fused graph": case("bench", "nofused", "--loop", "fused", code=BAD_INPUT,
                                               says=("--loop fused", "--loop step")),
    "--checkpoint missing": case(*POINTS, "--checkpoint", "nope", code=USAGE,
                                 says=("--checkpoint", "nope", "does not exist")),
    "--checkpoint not a checkpoint": case(*POINTS, "--checkpoint", "userdata", code=BAD_INPUT,
                                          says=("userdata", "spec.json", "missing")),
    "--checkpoint of a point model, token model": case(*TOKENS, "--checkpoint", "ckpt", code=BAD_INPUT,
                                                       says=("ckpt", "tokmodel", "hold different models")),
    "--checkpoint with a NaN weight": case(*TOKENS, "--checkpoint", "nanckpt", "--batch", "1", code=BAD_INPUT,
                                           says=("checkpoint nanckpt: encoder.bridge_h.weight holds 1 NaN or infinite "
                                                 "value", "retrain it or repair its weights")),
    "MODEL_DIR missing": case("bench", "nope", code=USAGE, says=("MODEL_DIR", "nope", "does not exist")),
    "MODEL_DIR not an export": case("bench", "userdata", code=BAD_INPUT, says=("userdata", "no manifest")),
}
if "cuda" not in DEVICES:  # where CUDA works, --provider cuda is a fine request
    BENCH_CASES["--provider cuda without CUDA"] = case(*POINTS, "--provider", "cuda", "--batch", "1", code=BAD_INPUT,
                                                       says=("provider 'cuda'", "CUDA"))


@pytest.mark.parametrize("name", list(BENCH_CASES))
def test_bench_refuses(workspace: Path, name: str) -> None:
    assert_refused(workspace, BENCH_CASES[name])


def test_fused_beam_cells_alone_on_a_transformer_export(transformer_export: Any) -> None:
    """--loop fused --beam 5: a transformer's export decodes beam search in its beam graph, so the cells exist."""
    result = bench(transformer_export.path, *grid_args([1], [3], [4], [5]), "--loop", "fused", *QUICK, "--json", "-")
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert {(c["loop"], c["beam"]) for c in cells} == {("fused", 5)}


def test_auto_is_timed_as_the_provider_it_chose() -> None:
    """--provider auto --provider cpu: auto's cells are named by the provider its sessions run on. Where that is the
    CPU, one set of cells, 'cpu' (they were 'auto' and 'cpu', the same sessions timed twice); where CUDA works, 'cuda'
    then 'cpu' (an H200, 2026-12-04)."""
    result = bench(SHIPPED_MODEL, *grid_args([1], [2], [2]), "--provider", "auto", "--provider", "cpu",
                   "--loop", "step", "--repeats", "1", "--warmup", "0", "--threads", "1", "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    ran = [c["providers"][0] for c in doc["cells"]]
    expected = ["cuda", "cpu"] if ran[0] == "CUDAExecutionProvider" else ["cpu"]
    assert [c["provider"] for c in doc["cells"]] == expected and doc["grid"]["provider"] == expected
    assert ran == [f"{name.upper()}ExecutionProvider" for name in expected]


def test_fused_loop_says_which_beam_cells_it_leaves_out() -> None:
    """--loop fused on a GRU export (no beam search graph) with --beam 1 --beam 3: the beam-3 cells cannot be timed
    in a fused graph; they are left out with a note, not silently."""
    result = bench(SHIPPED_TOKENS, *grid_args([1], [4], [3], [1, 3]), "--loop", "fused", "--repeats", "1",
                   "--warmup", "0", "--threads", "1", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert {c["beam"] for c in json.loads(result.stdout)["cells"]} == {1}
    assert "the beam 3 cells are left out" in result.stderr and "--loop both" in result.stderr


@pytest.mark.parametrize(("rate", "shown"), [(748.93, "748.9"), (7335.2, "7335"), (13390.4, "13390"),
                                             (0.51234, "0.5123"), (2.5e9, "2.500e+09")])
def test_rates_read_as_plain_numbers_in_their_column(rate: float, shown: str) -> None:
    """The seq/s and tok/s columns: one style per column, not 7335 beside 1.339e+04."""
    from runtime.bench_report import _rate

    assert _rate(rate) == shown and len(shown) <= 9


@pytest.mark.parametrize(("kind", "unit"), [("points", "pts/s"), ("tokens", "tok/s")])
def test_the_output_rate_is_named_for_the_model_kind(kind: str, unit: str) -> None:
    """A point model's outputs are points: its rate column says pts/s (it said tok/s)."""
    from runtime.bench_report import format_table

    head = format_table({"kind": kind, "cells": []}).splitlines()[0]
    assert unit in head and ("tok/s" in head) == (kind == "tokens")
