"""The foreign models through the command line and HTTP, as a user runs them: `seq2onnx export --adapter
MODULE:FUNCTION`, `verify --adapter`, `infer`, `eval` on a TSV, and `serve` (the one-process server, a real HTTP
client), each compared with the model's own PyTorch decode or the in-process runtime."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli.main import main
from runtime.model import Seq2Seq
from runtime.tokens import encode_sources
from serving.config import ServeConfig

from support.foreign import FOREIGN, corpus, trained
from support.serve import embedded, free_port

MODULE = '''
from support.foreign import trained


def tutorial():
    return trained("tutorial").adapter()


def luong():
    return trained("luong").adapter()


def transformer():
    return trained("transformer").adapter()
'''
TEXTS = [p[0] for p in corpus(6, seed=11)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("byo")
    (path / "foreign_models.py").write_text(MODULE)
    (path / "data.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in corpus(120, seed=5)))
    return path


def run(workdir: Path, *args: str):
    """`seq2onnx ARGS` in `workdir`, as a user in the directory that holds their module."""
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        return CliRunner().invoke(main, list(args), prog_name="seq2onnx", catch_exceptions=False)
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module", params=list(FOREIGN))
def exported(request, workdir) -> Path:
    result = run(workdir, "export", "--adapter", f"foreign_models:{request.param}", "--out", request.param)
    assert result.exit_code == 0, result.output
    assert "reference.ids" in result.output and "wrote" in result.output
    return workdir / request.param


def test_verify_compares_the_model_with_its_export(exported, workdir):
    result = run(workdir, "verify", "--adapter", f"foreign_models:{exported.name}", exported.name)
    assert result.exit_code == 0, result.output
    assert "all" in result.output and "checks within" in result.output


def test_verify_fails_when_none_of_its_data_can_be_read(workdir):
    """--data of other words for a vocabulary without an unknown id (the tutorial's): every text left out, so
    nothing of it was compared: not a pass."""
    model = "tutorial"
    if not (workdir / model).exists():
        assert run(workdir, "export", "--adapter", f"foreign_models:{model}", "--out", model).exit_code == 0
    result = run(workdir, "verify", "--adapter", f"foreign_models:{model}", model, "--data", "dates")
    assert result.exit_code == 1, result.output
    assert "none of the" in result.output and "nothing of it was compared" in result.output


def test_verify_warns_when_its_data_reads_as_unknown_tokens(workdir):
    """--data of other words for a vocabulary with an unknown id (luong's): every text reads as <unk>s, which the
    checks still run on, with a warning that they compare little real text."""
    model = "luong"
    if not (workdir / model).exists():
        assert run(workdir, "export", "--adapter", f"foreign_models:{model}", "--out", model).exit_code == 0
    result = run(workdir, "verify", "--adapter", f"foreign_models:{model}", model, "--data", "dates")
    assert result.exit_code == 0, result.output
    assert "of the source tokens of 'dates' are not in the model's source vocabulary" in result.output


def test_verify_refuses_another_models_export(exported, workdir):
    other = next(k for k in FOREIGN if k != exported.name)
    result = run(workdir, "verify", "--adapter", f"foreign_models:{other}", exported.name)
    assert result.exit_code == 1 and "are not a pair" in result.output


def test_infer_decodes_as_the_model_does(exported, workdir):
    result = run(workdir, "infer", exported.name, *[a for t in TEXTS for a in ("--text", t)])
    assert result.exit_code == 0, result.output
    got = [json.loads(line)["hypotheses"][0]["text"] for line in result.output.splitlines()]
    model = trained(exported.name)
    runtime = Seq2Seq.load(exported)
    ids, lengths = encode_sources(TEXTS, runtime.vocabularies["source"], runtime.spec, runtime.contract)
    own = model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), runtime.spec.target_len)
    assert got == [model.target.decode(row) for row in own]


def test_eval_scores_a_tsv(exported, workdir):
    result = run(workdir, "eval", exported.name, "--data", "data.tsv")
    assert result.exit_code == 0, result.output
    assert "greedy  exact" in result.output and "beam 5" in result.output


def test_eval_leaves_out_pairs_a_vocabulary_without_unk_cannot_read(workdir, tmp_path):
    """The tutorial's vocabularies have no unknown id: pairs with words they lack are left out, with a note."""
    model = "tutorial"
    if not (workdir / model).exists():
        assert run(workdir, "export", "--adapter", f"foreign_models:{model}", "--out", model).exit_code == 0
    pairs = corpus(40, seed=3)
    (tmp_path / "mixed.tsv").write_text("".join(f"{s} purple\t{t}\n" if i % 2 else f"{s}\t{t}\n"
                                                for i, (s, t) in enumerate(pairs)))
    result = run(workdir, "eval", model, "--data", str(tmp_path / "mixed.tsv"), "--split", "train")
    assert result.exit_code == 0, result.output
    assert "pairs hold tokens" in result.output and "left out" in result.output
    (tmp_path / "foreign.tsv").write_text("".join(f"{s} purple\t{t}\n" for s, t in pairs))
    result = run(workdir, "eval", model, "--data", str(tmp_path / "foreign.tsv"), "--split", "train")
    assert result.exit_code == 1 and "none of the" in result.output and "no unknown id" in result.output


def test_serve_answers_as_the_runtime_does(exported):
    runtime = Seq2Seq.load(exported, threads=1)
    port = free_port()
    with embedded({"": (exported, ServeConfig(batch_wait_ms=5.0))}, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            answer = client.post("/v1/translate", json={"texts": TEXTS, "beam_size": 3, "num_hypotheses": 2})
            info = client.get("/v1/model").json()
    assert answer.status_code == 200, answer.text
    want = runtime.translate_batch(TEXTS, beam_size=3, num_hypotheses=2)
    got = answer.json()["translations"]
    assert [[h["ids"] for h in hyps] for hyps in got] == [[t.ids for t in hyps] for hyps in want]
    np.testing.assert_allclose([h["score"] for hyps in got for h in hyps], [t.score for hyps in want for t in hyps],
                               rtol=1e-5)
    assert info["kind"] == "tokens"
    # its own fields only: a cell, hidden_dim or attention there would be the dataclass's defaults, not the model's
    assert info["spec"] == {"kind": "tokens", "arch": "declared", "source_vocab_size": runtime.spec.source_vocab_size,
                            "target_vocab_size": runtime.spec.target_vocab_size,
                            "input_len": runtime.spec.input_len, "target_len": runtime.spec.target_len}
    assert repr(runtime.spec).startswith("ModelSpec(kind='tokens', arch='declared', ") and "cell" not in repr(
        runtime.spec)


def test_bench_times_a_declared_model(exported, workdir):
    result = run(workdir, "bench", exported.name, "--batch", "2", "--beam", "1", "--beam", "3", "--threads", "1",
                 "--repeats", "2", "--warmup", "1", "--json", "-")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    assert {(r["beam"], r["batch"]) for r in doc["cells"]} >= {(1, 2), (3, 2)}


def test_an_int8_export_of_a_declared_model_loads_and_decodes(workdir, tmp_path):
    result = run(workdir, "export", "--adapter", "foreign_models:luong", "--out", str(tmp_path / "int8"),
                 "--quantize", "int8", "--accept-quality-loss")
    assert result.exit_code == 0, result.output
    runtime = Seq2Seq.load(tmp_path / "int8")
    assert runtime.manifest.raw["precision"]["weights"] == "int8" and runtime.spec.is_declared
    assert len(runtime.translate_batch(TEXTS, beam_size=2)) == len(TEXTS)


def readme_example() -> str:
    """The python block of the README's 'Bring your own model' section, as a user copies it into mymodel.py."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("## Bring your own model"):]
    return section[section.index("```python\n") + len("```python\n"):section.index("```\n", section.index("```python"))]


def test_the_readmes_example_exports_verifies_and_decodes(tmp_path):
    (tmp_path / "mymodel.py").write_text(readme_example())
    exported = run(tmp_path, "export", "--adapter", "mymodel:make_adapter", "--out", "models/mine")
    assert exported.exit_code == 0, exported.output
    verified = run(tmp_path, "verify", "--adapter", "mymodel:make_adapter", "models/mine")
    assert verified.exit_code == 0, verified.output
    decoded = run(tmp_path, "infer", "models/mine", "--text", "je suis froid", "--beam", "3", "--attention")
    assert decoded.exit_code == 0, decoded.output
    record = json.loads(decoded.output)
    # the model reads sources padded to 10 tokens and attends over all 10: the padding columns are shown too
    assert record["source_tokens"] == ["je", "suis", "froid", "EOS"] + ["SOS"] * 6
    np.testing.assert_allclose(np.sum(record["hypotheses"][0]["attention"], axis=1), 1.0, atol=1e-5)
