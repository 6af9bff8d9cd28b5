"""`seq2onnx train` on text: token checkpoints (vocabularies included), the held-out accuracy line, export of a token
checkpoint, exact resume, user files, and every bad input refused with one line and the right exit code."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from cli.main import main
from export.api import export_model
from export.errors import ExportError
from runtime.contract import (
    CHECKPOINT_PLOT_FILE,
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_STATE_FILE,
    VOCAB_FILES,
    partial_dir,
)
from runtime.defaults import (
    DATASET_DEFAULTS,
    SPEC_OPTIONS,
    TOKEN_DEFAULTS,
    TRANSFORMER_DEFAULTS,
    arch_defaults,
)
from runtime.model import Seq2Seq
from runtime.spec import TRAINABLE_ARCHS, ModelSpec
from runtime.vocab import SPECIAL_TOKENS, Vocabulary
from training.checkpoint import (
    TOKEN_CHECKPOINT_FILES,
    CheckpointError,
    load_checkpoint,
    load_checkpoint_vocabularies,
    save_checkpoint,
)
from training.tokens.builtin import BUILTIN_LOADERS, TOKENIZER_OF
from training.tokens.data import load_text_dataset
from training.tokens.evaluate import evaluate_beam, evaluate_tokens
from training.tokens.recurrent import TokenSeq2Seq
from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text
from training.tokens.transformer import TransformerSeq2Seq
from training.train_state import load_train_state, save_train_state

from support.devices import CUDA_UNAVAILABLE

REPO = Path(__file__).resolve().parents[1]
TINY = ["--hidden-dim", "8", "--embedding-dim", "4", "--eval-beam", "2"]
TINY_TRANSFORMER = ["--arch", "transformer", "--d-model", "8", "--d-ff", "16", "--heads", "2", "--layers", "1"]
NEW_OPTIONS = ("--arch", "--d-model", "--d-ff", "--dropout", "--norm", "--positional", "--warmup")
# Tiny models train fastest on one thread, and a shared 2-core machine stays usable.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
# Measured (tests/test_token_trainer.py): this setting reaches 9/9 exact on the toy translation.
LEARNS_TOY = ["--epochs", "12", "--batch-size", "3", "--lr", "0.03", "--lr-decay", "1", "--seed", "0",
              "--hidden-dim", "16", "--embedding-dim", "8", "--no-bidirectional", "--eval-beam", "3"]
ACCURACY = re.compile(r"(?P<which>held-out|test = training set) \((?P<n>\d+)\): greedy exact (?P<exact>[0-9.]+), "
                      r"token (?P<token>[0-9.]+)(?: \| beam (?P<k>\d+) exact (?P<beam>[0-9.]+))?"
                      r"(?: \| target >= (?P<target>[0-9.]+): (?P<met>met|NOT met))?$")


def cli(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`seq2onnx ARGS` in a child interpreter."""
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=ONE_THREAD, cwd=cwd)


def run(*args: object) -> Result:
    """`seq2onnx train --quiet ARGS` in this process (fast: torch is already imported)."""
    return CliRunner().invoke(main, ["train", "--quiet", *map(str, args)])


def accuracy(stdout: str) -> re.Match:
    lines = [m for line in stdout.splitlines() if (m := ACCURACY.match(line))]
    assert len(lines) == 1, stdout
    return lines[0]


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """toy-translation, 2 epochs of a tiny model, through the real command line."""
    ckpt = tmp_path_factory.mktemp("token-cli") / "ck"
    proc = cli("train", "--data", "toy-translation", "--epochs", "2", *TINY, "--out", ckpt)
    assert proc.returncode == 0, proc.stderr
    assert "epoch" in proc.stderr  # the progress bar
    return ckpt, proc.stdout


# -- train and export through the command line ----------------------------------------------------------------------


def test_train_writes_a_token_checkpoint_and_prints_the_accuracy(trained: tuple[Path, str]) -> None:
    ckpt, stdout = trained
    assert {p.name for p in ckpt.iterdir()} == TOKEN_CHECKPOINT_FILES
    assert not partial_dir(ckpt).exists()
    model, spec, history = load_checkpoint(ckpt)
    assert isinstance(model, TokenSeq2Seq) and not model.training
    assert (spec.kind, spec.hidden_dim, spec.embedding_dim, spec.attention, spec.bidirectional) == (
        "tokens", 8, 4, "dot", True)
    assert sorted(history) == ["train_loss", "val_exact", "val_token"] and len(history["train_loss"]) == 2
    meta = json.loads((ckpt / CHECKPOINT_SPEC_FILE).read_text())
    own = {k: v for k, v in DATASET_DEFAULTS["recurrent"]["toy-translation"].items()
           if k in TokenTrainConfig().to_dict()}
    assert meta["train"] == TokenTrainConfig(**{**own, "epochs": 2}).to_dict()  # the toy set's own defaults
    assert meta["data"]["name"] == "toy-translation"
    assert (ckpt / CHECKPOINT_PLOT_FILE).read_bytes().startswith(b"\x89PNG")

    source, target = load_checkpoint_vocabularies(ckpt)
    assert (len(source), len(target)) == (spec.source_vocab_size, spec.target_vocab_size)
    assert source.tokenizer == "whitespace" and "one" in source.tokens and "la" in target.tokens

    found = accuracy(stdout)
    test = load_text_dataset("toy-translation")[1]
    exact, token = evaluate_tokens(model, test, source, target)
    assert found["which"] == "test = training set" and int(found["n"]) == 9
    assert float(found["exact"]) == pytest.approx(exact, abs=1e-4)
    assert float(found["token"]) == pytest.approx(token, abs=1e-4)
    assert found["k"] == "2" and float(found["beam"]) == pytest.approx(evaluate_beam(model, test, source, target, 2),
                                                                       abs=1e-4)
    assert found["target"] == "1" and found["met"] == ("met" if exact >= 1.0 else "NOT met")


def test_train_arch_transformer_writes_a_transformer_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    proc = cli("train", "--data", "toy-translation", *TINY_TRANSFORMER, "--dropout", "0.1", "--norm", "post",
               "--positional", "learned", "--epochs", "2", "--eval-beam", "2", "--quiet", "--out", ckpt)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in ckpt.iterdir()} == TOKEN_CHECKPOINT_FILES
    meta = json.loads((ckpt / CHECKPOINT_SPEC_FILE).read_text())
    saved = ModelSpec.from_dict(meta["spec"])
    assert (saved.arch, saved.d_model, saved.d_ff, saved.n_heads, saved.layers, saved.norm, saved.positional,
            saved.dropout) == ("transformer", 8, 16, 2, 1, "post", "learned", 0.1)
    own = DATASET_DEFAULTS["transformer"]["toy-translation"]  # options not given: the set's transformer defaults
    assert meta["train"]["warmup"] == own["warmup"] and meta["train"]["batch_size"] == own["batch_size"]
    model, spec, history = load_checkpoint(ckpt)
    assert isinstance(model, TransformerSeq2Seq) and spec.hidden_dim == 8 and len(history["val_exact"]) == 2
    found = accuracy(proc.stdout)
    assert int(found["n"]) == 9 and found["k"] == "2"


def test_train_help_lists_the_transformer_options() -> None:
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0, result.output
    for option in NEW_OPTIONS:
        assert option in result.output, option
    assert "[recurrent|transformer]" in result.output and "[pre|post]" in result.output


def test_export_of_a_token_checkpoint_ships_its_vocabularies(trained: tuple[Path, str], tmp_path: Path) -> None:
    ckpt, _ = trained
    out = tmp_path / "model"
    proc = cli("export", ckpt, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert {VOCAB_FILES["source"], VOCAB_FILES["target"]} <= {p.name for p in out.iterdir()}
    translations = Seq2Seq.load(out).translate_batch(["one is one"])
    model, spec, _ = load_checkpoint(ckpt)
    source, target = load_checkpoint_vocabularies(ckpt)
    ids = torch.tensor([source.encode("one is one")])
    assert translations[0][0].ids == model.greedy(ids, torch.tensor([ids.shape[1]]), spec.target_len)[0]
    assert translations[0][0].text == target.decode(translations[0][0].ids)


def test_infer_names_the_inputs_read_with_the_unknown_token() -> None:
    """The shipped dates model reads lower case: 'May 3 2001' decoded as 2001-01-03 without a word, its 'M' read as
    <unk> (found by a fresh walk). A note on stderr names each such input and its unknown tokens, once each."""
    proc = cli("infer", REPO / "artifacts" / "dates", "--text", "May 3 2001", "--text", "may 3 2001", "--text",
               "JUNE 4 1999 xyz")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["index"] for line in proc.stdout.splitlines()] == [0, 1, 2]
    assert proc.stderr.splitlines() == [
        "note: 2 inputs held tokens the model's source vocabulary lacks, read as its unknown token: --text #1 ('M'); "
        "--text #3 ('J', 'U', 'N', 'E', 'x', 'z'); check their case and spelling"]
    assert cli("infer", REPO / "artifacts" / "dates", "--text", "may 3 2001").stderr == ""


def test_the_unknown_token_note_holds_a_few_inputs_however_many_there_are() -> None:
    """A run of a million such lines holds five and a count, not a list of a million (nor a line of every token)."""
    from runtime.infer_tokens import Item, Unknowns

    unknowns = Unknowns()
    for i in range(100_000):
        unknowns.add(Item(i, "x", f"line {i + 1}"), list("QWERTYUIOPQ"))
    assert unknowns.count == 100_000 and len(unknowns.first) == Unknowns.SHOWN
    assert unknowns.note() == (
        "note: 100000 inputs held tokens the model's source vocabulary lacks, read as its unknown token: "
        + "; ".join(f"line {i} ('Q', 'W', 'E', 'R', 'T', 'Y', 'U', 'I', ...)" for i in range(1, 6))
        + "; ...; check their case and spelling")


def test_the_unknown_token_note_shows_the_start_of_a_long_token() -> None:
    """One word of 300,000 characters: the note wrote all of it to stderr (found by a fresh walk)."""
    from runtime.infer_tokens import Item, Unknowns

    unknowns = Unknowns()
    unknowns.add(Item(0, "x", "line 1"), ["Q" * 300_000, "é"])
    assert unknowns.note() == (
        "note: 1 input held tokens the model's source vocabulary lacks, read as its unknown token: line 1 "
        f"('{'Q' * 20}... (300000 characters)', 'é'); check their case and spelling")


@pytest.mark.skipif(CUDA_UNAVAILABLE is None, reason="CUDA works here: --device-id picks a GPU")
def test_infer_device_id_where_auto_finds_no_gpu_is_said() -> None:
    """--provider cpu --device-id is refused; with auto (the default) a script may pass it on machines with and
    without GPUs: it decodes, and says the option changed nothing (it was dropped without a word)."""
    proc = cli("infer", REPO / "artifacts" / "dates", "--text", "May 3 2001", "--device-id", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"] == "May 3 2001"
    assert "note: --device-id 1 picks a GPU, and --provider auto found no CUDA here (the model runs on " \
           "CPUExecutionProvider), so it changed nothing" in proc.stderr


def test_verify_blames_a_tight_tolerance_not_the_pair_of_a_recurrent_model() -> None:
    """The shipped GRU pair under --atol 0 --rtol 0: its log-probs differ by ~1e-4 at -11 to -15 (rounding carried
    through the recurrence, within the tolerances the export was checked at), which read as 'not a pair'."""
    proc = cli("verify", REPO / "artifacts" / "dates-checkpoint", REPO / "artifacts" / "dates", "--atol", "0",
               "--rtol", "0")
    assert proc.returncode == 1, proc.stderr
    assert "tighter than an export can hold" in proc.stderr and "not a pair" not in proc.stderr, proc.stderr


def test_verify_of_a_copied_checkpoint_says_the_differences_are_rounding(tmp_path: Path) -> None:
    """A copy of the checkpoint under another name, under --atol 0: the export does not name it, so the pair is
    suspected, but the verdict says every difference is float32-sized (it pointed at the pair alone)."""
    copy = tmp_path / "renamed"
    shutil.copytree(REPO / "artifacts" / "dates-checkpoint", copy)
    proc = cli("verify", copy, REPO / "artifacts" / "dates", "--atol", "0", "--rtol", "0")
    assert proc.returncode == 1, proc.stderr
    assert "not a pair; but every difference is float32-sized" in proc.stderr, proc.stderr
    assert f"if {copy} is a copy or a move of it, the tolerance is the suspect" in proc.stderr


def test_verify_of_a_token_model_names_only_the_tolerances_it_judges_by() -> None:
    """--drift-atol judges a point model's free-running decode; a token model's ids must be equal and its log-probs
    are judged by --atol and --rtol, so the verdict does not say a drift_atol was applied (it said 'drift_atol=0')."""
    proc = cli("verify", REPO / "artifacts" / "dates-checkpoint", REPO / "artifacts" / "dates", "--drift-atol", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("checks within atol=1e-05, rtol=0.0001"), proc.stdout[-300:]
    assert "drift_atol" not in proc.stdout


def test_verify_refuses_an_export_with_other_vocabularies(trained: tuple[Path, str], tmp_path: Path) -> None:
    """Same weights, same spec, a vocabulary with two tokens swapped: the ids match, the texts would not."""
    ckpt, _ = trained
    out = tmp_path / "model"
    assert cli("export", ckpt, "--out", out).returncode == 0
    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    file = other / VOCAB_FILES["source"]
    data = json.loads(file.read_text())
    data["tokens"][-1], data["tokens"][-2] = data["tokens"][-2], data["tokens"][-1]
    file.write_text(json.dumps(data))
    meta = json.loads((other / CHECKPOINT_SPEC_FILE).read_text())
    meta.pop("vocabularies")  # as if written before checkpoints hashed their vocabularies
    (other / CHECKPOINT_SPEC_FILE).write_text(json.dumps(meta))
    proc = cli("verify", other, out)
    assert proc.returncode == 1 and "source vocabulary" in proc.stderr and "not a pair" in proc.stderr, proc.stderr
    assert cli("verify", ckpt, out).returncode == 0


def test_export_checks_explicit_vocabularies_against_the_checkpoint(trained: tuple[Path, str],
                                                                   tmp_path: Path) -> None:
    ckpt, _ = trained
    source, target = load_checkpoint_vocabularies(ckpt)
    other = Vocabulary(SPECIAL_TOKENS + tuple(f"w{i}" for i in range(len(source) - 4)), "whitespace")
    with pytest.raises(ExportError, match="differ from the ones saved in checkpoint"):
        export_model(ckpt, tmp_path / "m", vocabularies=(other, target))
    assert not (tmp_path / "m").exists()


def test_a_user_tsv_trains_into_the_default_out(tmp_path: Path) -> None:
    lines = [f"{a} plus {b}\t{a + b}" for a in range(6) for b in range(4)]
    (tmp_path / "sums.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli("train", "--data", "sums.tsv", "--epochs", "1", "--attention", "additive", "--cell", "lstm",
               *TINY, "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ckpt = tmp_path / "artifacts" / "checkpoints" / "sums-additive"
    _, spec, _ = load_checkpoint(ckpt)
    assert (spec.attention, spec.cell) == ("additive", "lstm")
    found = accuracy(proc.stdout)
    assert found["which"] == "held-out" and int(found["n"]) == 5 and found["target"] is None  # 20% of 24


def test_bad_tsv_lines_are_one_error_naming_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("a b\tc\nno tab here\nx\ty\tz\n", encoding="utf-8")
    proc = cli("train", "--data", bad, "--out", tmp_path / "ck")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "line 2 has 0 tabs" in proc.stderr and "line 3 has 2 tabs" in proc.stderr
    assert not (tmp_path / "ck").exists()


def test_a_token_option_with_point_data_is_a_usage_error_in_a_subprocess(tmp_path: Path) -> None:
    proc = cli("train", "--data", "squares", "--cell", "lstm", "--out", tmp_path / "ck")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'--cell'" in proc.stderr and "token models" in proc.stderr
    assert not (tmp_path / "ck").exists()


# -- in-process runs: resume, options, the accuracy target -----------------------------------------------------------


@pytest.mark.parametrize(("model", "again"), [
    (["--hidden-dim", "8", "--embedding-dim", "4"], ["--hidden-dim", "8"]),
    ([*TINY_TRANSFORMER, "--dropout", "0.1", "--warmup", "4"], ["--d-model", "8", "--arch", "transformer"]),
])
def test_resume_of_a_finished_or_interrupted_run_equals_an_uninterrupted_one(tmp_path: Path, model: list[str],
                                                                            again: list[str]) -> None:
    args = ["--data", "toy-translation", *model, "--tokenizer", "whitespace"]
    straight, extended, interrupted = tmp_path / "straight", tmp_path / "extended", tmp_path / "interrupted"
    assert run(*args, "--epochs", "3", "--out", straight).exit_code == 0
    assert run(*args, "--epochs", "1", "--out", extended).exit_code == 0
    state = load_train_state(extended / CHECKPOINT_STATE_FILE)
    save_train_state(partial_dir(interrupted) / CHECKPOINT_STATE_FILE, state, state["data"])  # stopped after 1
    result = run("--resume", "--epochs", "3", "--eval-beam", "0", "--out", extended)  # not a run option: free
    assert result.exit_code == 0, result.output
    assert accuracy(result.output)["k"] is None
    result = run("--resume", "--epochs", "3", *again, "--out", interrupted)  # saved values may be given
    assert result.exit_code == 0, result.output
    assert not partial_dir(interrupted).exists()
    reference, _, history = load_checkpoint(straight)
    for out in (extended, interrupted):
        model, _, resumed = load_checkpoint(out)
        assert resumed == history and same_weights(model, reference)
        assert load_checkpoint_vocabularies(out) == load_checkpoint_vocabularies(straight)
    assert run(*args, "--epochs", "1", "--force", "--out", straight).exit_code == 0  # a token checkpoint is replaced


def test_resume_keeps_the_eval_beam_of_the_run_unless_given(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    assert run("--data", "toy-translation", *TINY, "--epochs", "1", "--eval-beam", "0", "--out", out).exit_code == 0
    result = run("--resume", "--epochs", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert accuracy(result.output)["k"] is None  # still no beam report
    result = run("--resume", "--epochs", "3", "--eval-beam", "2", "--out", out)  # free to change
    assert result.exit_code == 0, result.output
    assert accuracy(result.output)["k"] == "2"


@pytest.mark.parametrize(("args", "hint", "saved"), [
    (["--cell", "lstm"], "'--cell'", "'gru'"),
    (["--tokenizer", "char"], "'--tokenizer'", "'whitespace'"),
    (["--no-bidirectional"], "'--bidirectional'", "True"),
    (["--data", "reverse"], "'--data'", "'toy-translation'"),
    (["--arch", "transformer"], "'--arch'", "'recurrent'"),
    (["--warmup", "5"], "'--warmup'", "0"),
])
def test_resume_refuses_a_changed_option(tmp_path: Path, args: list[str], hint: str, saved: str) -> None:
    out = tmp_path / "ck"
    assert run("--data", "toy-translation", *TINY, "--epochs", "1", "--out", out).exit_code == 0
    result = run("--resume", "--epochs", "2", *args, "--out", out)
    assert result.exit_code == 2 and hint in result.output and saved in result.output, result.output
    assert "the run being resumed used" in result.output
    assert len(load_checkpoint(out)[2]["train_loss"]) == 1  # untouched


def test_resume_names_an_option_of_another_kind_of_model(tmp_path: Path) -> None:
    """--cell when resuming a transformer: the option does not fit the run at all, not 'it used gru'."""
    out = tmp_path / "tf"
    assert run("--data", "toy-translation", "--arch", "transformer", "--epochs", "1", "--out", out).exit_code == 0
    result = run("--resume", "--epochs", "2", "--cell", "lstm", "--out", out)
    assert result.exit_code == 2 and "--cell lstm is for recurrent token models" in result.output, result.output
    assert "the run being resumed used" not in result.output


@pytest.mark.parametrize(("args", "said"), [
    (["--arch", "transformer", "--attention", "dot"], "--attention dot is for recurrent token models"),
    (["--arch", "transformer", "--no-bidirectional"], "--no-bidirectional is for recurrent token models"),
    (["--arch", "transformer", "--hidden-dim", "48"], "--hidden-dim 48 is for recurrent token models"),
    (["--norm", "pre"], "--norm pre is for transformers, but --arch recurrent"),
])
def test_an_option_of_the_other_arch_is_refused_as_it_was_given(tmp_path: Path, args: list[str], said: str) -> None:
    """The refusal echoes the option with its value, so a user sees which of a long command line was wrong."""
    result = run("--data", "toy-translation", *args, "--out", tmp_path / "ck")
    assert result.exit_code == 2 and said in result.output, result.output
    assert not (tmp_path / "ck").exists()


def test_a_run_that_learns_the_toy_translation_meets_its_target(tmp_path: Path) -> None:
    result = run("--data", "toy-translation", *LEARNS_TOY, "--out", tmp_path / "ck")
    assert result.exit_code == 0, result.output
    found = accuracy(result.output)
    assert float(found["exact"]) == 1.0 and found["met"] == "met" and found["k"] == "3"


def test_parallel_files_and_a_tokenizer_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    pairs = load_text_dataset("toy-translation")[0]
    (tmp_path / "src.txt").write_text("\n".join(pairs.sources) + "\n", encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("\n".join(pairs.targets) + "\n", encoding="utf-8")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([*pairs.sources, *pairs.targets],
                                  tokenizers.trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS)))
    tokenizer.save(str(tmp_path / "tok.json"))
    data = f"{tmp_path / 'src.txt'},{tmp_path / 'tgt.txt'}"
    result = run("--data", data, "--tokenizer", tmp_path / "tok.json", "--epochs", "1", *TINY,
                 "--out", tmp_path / "ck")
    assert result.exit_code == 0, result.output
    source, target = load_checkpoint_vocabularies(tmp_path / "ck")
    assert source == target and source.tokenizer == "subword"
    assert accuracy(result.output)["n"] == "2"  # 20% of 9, rounded
    assert cli("export", tmp_path / "ck", "--out", tmp_path / "m").returncode == 0
    blocked = subprocess.run(  # a runtime-only install without the `text` extra: refused at load, in one line
        [sys.executable, "-c", "import sys; sys.modules['tokenizers'] = None; from cli.main import main; main()",
         "infer", str(tmp_path / "m"), "--text", "one is one"], capture_output=True, text=True, cwd=REPO)
    assert blocked.returncode == 1 and "Traceback" not in blocked.stderr, blocked.stderr
    assert blocked.stderr.startswith("Error: ") and "'text' extra" in blocked.stderr


@pytest.mark.parametrize(("args", "code", "fragments"), [
    (["--data", "squares", "--embedding-dim", "8"], 2, ["'--embedding-dim'", "token models"]),
    (["--data", "squares", "--no-bucket"], 2, ["'--no-bucket'", "token models"]),
    (["--data", "squares", "--attention", "additive"], 2, ["'--attention'", "'additive' is for token models"]),
    (["--tokenizer", "missing.json"], 2, ["'--tokenizer'", "does not exist"]),
    (["--tokenizer", "bpe"], 2, ["'--tokenizer'", "expected 'char' or 'whitespace'"]),
    (["--tokenizer", "tok.json", "--min-freq", "2"], 2, ["'--min-freq'", "brings its own"]),
    (["--tokenizer", "tok.json"], 1, ["Error: --tokenizer ", "tok.json: tokenizer"]),  # not one, or no package
    (["--heads", "2"], 2, ["'--heads'", "need --attention multihead, got --attention dot (the default); drop"]),
    (["--attention", "additive", "--heads", "2"], 2, ["'--heads'", "got --attention additive; drop"]),
    (["--attention", "multihead", "--heads", "3", "--hidden-dim", "8"], 2, ["'--heads'", "--hidden-dim 8 is not a "
                                                                             "multiple of 3"]),
    (["--attention", "multihead", "--heads", "3"], 2, ["--hidden-dim 32 (the default for --data toy-translation) is "
                                                       "not a multiple of 3 heads"]),
    (["--hidden-dim", "5000"], 2, ["'--hidden-dim'", "1<=x<=4096"]),
    (["--embedding-dim", "4097"], 2, ["'--embedding-dim'", "1<=x<=4096"]),
    (["--layers", "9"], 2, ["'--layers'", "1<=x<=8"]),
    (["--min-freq", "1000"], 2, ["'--min-freq'", "keeps no source token"]),
    (["--data", "missing.tsv"], 2, ["'--data'", "does not exist"]),
    (["--data", "missing.TSV"], 2, ["'--data'", "does not exist"]),  # a TSV file in any case, as .npz
    (["--data", ""], 2, ["'--data'", "got an empty value ''"]),
    (["--data", "a.txt,b.txt"], 2, ["'--data'", "source file 'a.txt' does not exist"]),
    (["--data", "reversed"], 2, ["'--data'", "expected 'squares' or PATH.npz"]),
    (["--data", "empty.tsv"], 1, ["--data:", "holds no pairs"]),
])
def test_bad_inputs_are_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                            code: int, fragments: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok.json").write_text("{}", encoding="utf-8")  # exists; refused for the option clash first
    (tmp_path / "empty.tsv").write_text("\n", encoding="utf-8")
    data = [] if "--data" in args else ["--data", "toy-translation"]
    result = run(*data, *args, "--epochs", "1", "--out", tmp_path / "ck")
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    for fragment in fragments:
        assert fragment in result.output, result.output
    assert not (tmp_path / "ck").exists()


# -- the library: checkpoints, vocabularies, defaults ----------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TokenTrainer]:
    """A one-epoch toy model saved with save_checkpoint, as the command does."""
    train, test = load_text_dataset("toy-translation")
    source, target = Vocabulary.build(train.sources, "whitespace"), Vocabulary.build(train.targets, "whitespace")
    spec = spec_for_text(train, source, target, hidden_dim=8, embedding_dim=4, cell="lstm", layers=2)
    trainer = TokenTrainer(spec, TokenTrainConfig(epochs=1), train, test, source, target)
    trainer.fit(progress=False)
    out = tmp_path_factory.mktemp("lib") / "ck"
    save_checkpoint(out, trainer.model, spec, trainer.config, trainer.history, {"name": "toy-translation"},
                    trainer.state_dict(), vocabularies=(source, target))
    return out, trainer


def test_token_checkpoint_round_trips(toy_checkpoint: tuple[Path, TokenTrainer]) -> None:
    out, trainer = toy_checkpoint
    model, spec, history = load_checkpoint(out)
    assert isinstance(model, TokenSeq2Seq) and spec == trainer.spec and history == trainer.history
    assert same_weights(model, trainer.model)
    source, target = load_checkpoint_vocabularies(out)
    assert (source.sha256, target.sha256) == (trainer.source_vocab.sha256, trainer.target_vocab.sha256)


@pytest.mark.parametrize(("damage", "message"), [
    ("missing", "is missing; a token checkpoint keeps its source vocabulary there"),
    ("fewer tokens", "holds 13 tokens, but the spec's source_vocab_size is 14"),
    ("not json", "is not valid JSON"),
    ("not a vocabulary", "vocabulary keys must be"),
    ("two tokens swapped", "differs from the vocabulary it was trained with"),
])
def test_vocabulary_loader_names_a_missing_or_edited_file(toy_checkpoint: tuple[Path, TokenTrainer],
                                                         tmp_path: Path, damage: str, message: str) -> None:
    out = tmp_path / "ck"
    shutil.copytree(toy_checkpoint[0], out)
    file = out / VOCAB_FILES["source"]
    if damage == "missing":
        file.unlink()
    elif damage == "fewer tokens":
        data = json.loads(file.read_text())
        file.write_text(json.dumps({**data, "tokens": data["tokens"][:-1]}))
    elif damage == "two tokens swapped":  # same size, still a vocabulary: only the hash in spec.json can tell
        data = json.loads(file.read_text())
        tokens = data["tokens"]
        tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
        file.write_text(json.dumps(data))
    else:
        file.write_text("{not json" if damage == "not json" else '{"tokens": []}')
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        load_checkpoint_vocabularies(out)
    assert str(file) in str(err.value)
    load_checkpoint(out)  # the model itself still loads


def test_point_checkpoints_load_unchanged_and_have_no_vocabularies() -> None:
    shipped = REPO / "artifacts" / "squares-checkpoint"
    model, spec, history = load_checkpoint(shipped)
    assert spec.kind == "points" and "train" in history and not isinstance(model, TokenSeq2Seq)
    with pytest.raises(CheckpointError, match="holds a point model, which has no vocabularies"):
        load_checkpoint_vocabularies(shipped)


def test_transformer_defaults_are_options_of_train() -> None:
    assert set(TRANSFORMER_DEFAULTS) <= set(TOKEN_DEFAULTS) | {"heads"}  # each one an option of train


@pytest.mark.parametrize("arch", TRAINABLE_ARCHS)
@pytest.mark.parametrize("data", sorted(BUILTIN_LOADERS))
def test_every_arch_and_built_in_set_has_defaults_that_build(arch: str, data: str) -> None:
    """The defaults tables agree with the spec's and the config's checks (heads divide d_model, and so on)."""
    opts = arch_defaults(arch, data)
    TokenTrainConfig(**{k: opts[k] for k in TokenTrainConfig().to_dict() if k != "seed"})
    train = load_text_dataset(data)[0].subset(range(9))
    vocab = Vocabulary.build(train.sources + train.targets, TOKENIZER_OF[data])
    heads = opts.get("heads") or 1
    spec = spec_for_text(train, vocab, vocab, n_heads=heads, **{k: opts[k] for k in SPEC_OPTIONS if k in opts},
                         arch=arch)
    assert spec.arch == arch


def _byte_level_tokenizer(path: Path) -> None:
    """A byte-level BPE: 'é' is two tokens, so a line of 900 of them is 1800 (lines are at most 1000 characters)."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=60, special_tokens=list(SPECIAL_TOKENS),
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["a b c", "é b", "x y z"] * 10, trainer)
    tokenizer.save(str(path))


def test_sources_and_targets_longer_than_a_model_reads_are_refused_before_training_and_left_out_of_eval(tmp_path):
    """A transformer trained on a target of 1801 tokens stopped in its position table with an 85-line traceback; a
    recurrent model trained on such a source, and eval of its own data stopped at it naming 'texts[0]' (the place in
    a --batch-size chunk); found by a fresh walk."""
    _byte_level_tokenizer(tmp_path / "bl.json")
    long = "é" * 900
    (tmp_path / "long_target.tsv").write_text("".join(f"a b c\t{long if i == 0 else 'é b'}\n" for i in range(20)))
    (tmp_path / "long_source.tsv").write_text("".join(f"{long if i == 3 else 'é b'}\ta b c\n" for i in range(20)))
    (tmp_path / "short.tsv").write_text("".join("é b\ta b c\n" for _ in range(20)))
    refused = run("--data", tmp_path / "long_target.tsv", "--tokenizer", tmp_path / "bl.json", "--epochs", "1",
                  *TINY_TRANSFORMER, "--out", tmp_path / "tf")
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert ("long_target.tsv: 1 target(s) hold more tokens than this transformer's position table (1024 positions); "
            "the first, 'éééééééééééééééééééé... (900 characters)', is 1801 tokens with its closing </s> under the "
            "subword vocabulary: shorten or split such pairs") in refused.output, refused.output
    refused = run("--data", tmp_path / "long_source.tsv", "--tokenizer", tmp_path / "bl.json", "--epochs", "1",
                  *TINY, "--out", tmp_path / "rnn")
    assert refused.exit_code == 1 and "1 source(s) hold more tokens than the 1024 the runtime reads of one source" \
        in refused.output, refused.output
    assert not (tmp_path / "tf").exists() and not (tmp_path / "rnn").exists()
    trained = run("--data", tmp_path / "short.tsv", "--tokenizer", tmp_path / "bl.json", "--epochs", "1", *TINY,
                  "--out", tmp_path / "ck")
    assert trained.exit_code == 0, trained.output
    assert cli("export", tmp_path / "ck", "--out", tmp_path / "m").returncode == 0
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "m"), "--data", str(tmp_path / "long_source.tsv"),
                                       "--split", "train", "--quiet", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    assert re.search(r"note: 1 of \d+ train pairs have a source longer than .*m reads \(the first: 1801 tokens "
                     r"with the closing </s>, more than the 1024 the runtime reads of one source", result.output), \
        result.output


def test_resume_takes_moved_data_and_tokenizer_files_that_hold_the_same_bytes(tmp_path: Path) -> None:
    """Resume read the paths the run started with: a moved --data said 'does not exist', and giving its new path
    'the run being resumed used ...; leave the option out': a dead end (found by a fresh walk). Now a moved file is
    taken if it holds the run's bytes (its sha256, the vocabulary's for a tokenizer), and refused by what differs."""
    tokenizers = pytest.importorskip("tokenizers")
    pairs = load_text_dataset("toy-translation")[0]
    first = tmp_path / "first"
    first.mkdir()
    (first / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(pairs.sources, pairs.targets)))
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([*pairs.sources, *pairs.targets],
                                  tokenizers.trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS)))
    tokenizer.save(str(first / "tok.json"))
    out = tmp_path / "ck"
    started = run("--data", first / "pairs.tsv", "--tokenizer", first / "tok.json", *TINY, "--epochs", "1",
                  "--out", out)
    assert started.exit_code == 0, started.output
    moved = tmp_path / "moved"
    first.rename(moved)
    lost = run("--resume", "--epochs", "2", "--out", out)
    assert lost.exit_code != 0 and "if it moved, give --data with its new path (the same bytes)" in lost.output, \
        lost.output
    (tmp_path / "other.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(pairs.sources, pairs.targets[::-1])))
    other = run("--resume", "--epochs", "2", "--data", tmp_path / "other.tsv", "--tokenizer", moved / "tok.json",
                "--out", out)
    assert other.exit_code == 1 and "not the data the run being resumed read" in other.output, other.output
    assert "they differ in sha256" in other.output and len(load_checkpoint(out)[2]["train_loss"]) == 1
    no_tokenizer = run("--resume", "--epochs", "2", "--data", moved / "pairs.tsv", "--out", out)
    assert no_tokenizer.exit_code == 1 and "tok.json" in no_tokenizer.output and "the run being resumed read it: if " \
        "it moved, give --tokenizer with its new path (the same vocabulary)" in no_tokenizer.output, no_tokenizer.output
    resumed = run("--resume", "--epochs", "2", "--data", moved / "pairs.tsv", "--tokenizer", moved / "tok.json",
                  "--out", out)
    assert resumed.exit_code == 0, resumed.output
    assert len(load_checkpoint(out)[2]["train_loss"]) == 2
