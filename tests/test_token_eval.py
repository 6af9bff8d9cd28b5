"""`seq2onnx eval` through real subprocesses, on a toy-translation model trained to 100% and exported once."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cli.main import main
from export.api import export_model
from runtime.model import Seq2Seq
from runtime.sessions import default_threads
from runtime.vocab import EOS, Vocabulary
from training.tokens.builtin import ACCURACY_TARGETS, TOKENIZER_OF, TOY_TRANSLATION
from training.tokens.data import load_text_dataset
from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text

SQUARES = Path(__file__).resolve().parents[1] / "artifacts" / "squares"
# Runs the CLI where `import torch` fails, as on a runtime-only install: eval must not need it.
NO_TORCH = "import sys; sys.modules['torch'] = None; from cli.main import main; sys.argv[0] = 'seq2onnx'; main()"
# Full-batch Adam at a constant 1e-2 reaches 9/9 exact after epoch 10 (measured); 20 leaves a margin. About 1 s.
TOY_CONFIG = TokenTrainConfig(epochs=20, batch_size=9, lr=1e-2, lr_decay=1.0)


def cli(*args: object, no_torch: bool = False) -> subprocess.CompletedProcess:
    """Run `seq2onnx eval ARGS` in a subprocess of this interpreter."""
    prefix = [sys.executable, "-c", NO_TORCH] if no_torch else [sys.executable, "-m", "cli"]
    return subprocess.run([*prefix, "eval", *map(str, args)], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory) -> Path:
    """A GRU + dot-attention model (hidden 32) trained on toy-translation and exported."""
    torch.set_num_threads(1)  # the 100% above was measured at one thread; other counts round differently
    train, test = load_text_dataset(TOY_TRANSLATION)
    kind = TOKENIZER_OF[TOY_TRANSLATION]
    source, target = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
    trainer = TokenTrainer(spec_for_text(train, source, target, hidden_dim=32), TOY_CONFIG, train, test, source,
                           target)
    history = trainer.fit(progress=False)
    assert history["val_exact"][-1] == 1.0, history
    return export_model(trainer.model, tmp_path_factory.mktemp("eval") / "toy", vocabularies=(source, target))


def test_eval_help():
    result = CliRunner().invoke(main, ["eval", "--help"])
    assert result.exit_code == 0, result.output
    assert all(option in result.output for option in ("--data", "--beam", "--min-exact", "--json", "--split"))


def test_eval_prints_the_figures_and_the_target_without_torch(toy_model):
    result = cli(toy_model, "--data", TOY_TRANSLATION, "--beam", "3", no_torch=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "test split: 9 sequences" in lines[1]
    assert lines[2].startswith("greedy  exact 1.0000 (9/9)  token 1.0000") and "seq/s" in lines[2]
    assert lines[3].startswith("beam 3  exact 1.0000 (9/9)")
    assert "never worse than greedy (greedy right, beam wrong: 0;" in lines[4]
    assert lines[5] == f"target  greedy exact >= {ACCURACY_TARGETS[TOY_TRANSLATION]:g} for toy-translation: met"
    assert "warning" not in result.stderr


def test_eval_draws_its_progress_bars_only_on_a_terminal(toy_model):
    """To a pipe or a log, a bar that leaves nothing left its frames and carriage returns before the next line."""
    result = cli(toy_model, "--data", TOY_TRANSLATION, "--beam", "2")
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_eval_json_matches_translate_batch(toy_model):
    result = cli(toy_model, "--data", TOY_TRANSLATION, "--json", "--limit", "7", "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sequences"] == 7 and report["split"] == "test" and report["warnings"] == []
    assert report["threads"] == default_threads()  # the threads it ran on, not null when --threads is not given
    assert report["precision"] == "fp32"  # as bench says it (eval named no precision: int8 and fp32 read alike)
    _, test = load_text_dataset(TOY_TRANSLATION)
    model = Seq2Seq.load(toy_model, provider="cpu")
    max_len = report["max_decoding_length"]
    found = model.translate_batch(list(test.sources[:7]), max_decoding_length=max_len)
    references = [model.vocabularies["target"].encode(t, add_eos=False) for t in test.targets[:7]]
    exact = sum(h[0].ids == r and len(h[0].ids) < max_len for h, r in zip(found, references))
    assert report["greedy"]["exact_count"] == exact
    assert report["greedy"]["exact"] == exact / 7
    assert report["beam"]["beam_size"] == 5 and report["beam"]["lost"] == 0 and report["beam"]["never_worse"]
    assert report["greedy"]["sequences_per_s"] > 0 and report["beam"]["sequences_per_s"] > 0


def test_min_exact_above_the_accuracy_exits_1_after_printing(toy_model):
    result = cli(toy_model, "--data", "reverse", "--limit", "20", "--beam", "0", "--min-exact", "0.5", "--quiet")
    assert result.returncode == 1  # the toy model knows no digits
    assert "greedy  exact 0.0000" in result.stdout
    assert f"model   {toy_model} (fp32, CPUExecutionProvider)" in result.stdout
    assert "Error: greedy exact accuracy 0.0000 is below --min-exact 0.5" in result.stderr
    assert cli(toy_model, "--data", TOY_TRANSLATION, "--beam", "0", "--min-exact", "1", "--quiet").returncode == 0
    beyond = cli(toy_model, "--data", TOY_TRANSLATION, "--min-exact", "1.01", "--quiet")
    assert beyond.returncode == 2 and "--min-exact" in beyond.stderr  # an accuracy above 1 is a usage mistake


def test_beam_0_skips_beam(toy_model):
    text = cli(toy_model, "--data", TOY_TRANSLATION, "--beam", "0", "--quiet")
    assert text.returncode == 0, text.stderr
    assert "beam    skipped (--beam 0)" in text.stdout and "beam vs greedy" not in text.stdout
    report = json.loads(cli(toy_model, "--data", TOY_TRANSLATION, "--beam", "0", "--json", "--quiet").stdout)
    assert report["beam"] is None


def test_mismatched_data_warns_about_unknown_tokens(toy_model):
    result = cli(toy_model, "--data", "reverse", "--limit", "5", "--beam", "0", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "warning: 100% of the source tokens are not in the model's source vocabulary" in result.stderr
    report = json.loads(result.stdout)
    assert report["unknown_fraction"]["source"] == 1.0 and report["greedy"]["exact"] == 0.0
    assert report["target"] == {"exact": ACCURACY_TARGETS["reverse"], "met": False}


@pytest.mark.parametrize("target_name", ["tgt.txt", "tgt.tsv"])  # .tsv: read as one file name before
def test_user_file_data_and_train_split(toy_model, tmp_path, target_name):
    sources, targets = tmp_path / "src.txt", tmp_path / target_name
    sources.write_text("one is one\ntwo is two\nthree is three\nfour is four\nfive is five\n")
    targets.write_text("1 la 1\n2 la 2\n3 la 3\n4 la 4\n5 la 5\n")
    result = cli(toy_model, "--data", f"{sources},{targets}", "--split", "train", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sequences"] == 4 and report["greedy"]["exact"] == 1.0 and report["target"] is None


def test_a_point_model_is_refused(toy_model):
    result = cli(SQUARES, "--data", TOY_TRANSLATION)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        (f"Error: {SQUARES} is a point model (kind 'points'), which takes numeric sources; eval scores token "
         "models on text data (use `seq2onnx infer` for point models)")]


@pytest.mark.parametrize("args, fragment", [
    (["--data", "no-such-set"],
     "expected reverse, toy-translation, lookup, dates, PATH.tsv or SRC_PATH,TGT_PATH; got 'no-such-set'"),
    (["--data", "missing.tsv"], "file 'missing.tsv' does not exist"),
    (["--data", "squares"], "got 'squares' (point data: eval scores token models on text; `seq2onnx infer` decodes"),
    (["--data", TOY_TRANSLATION, "--threads", "0"], "expected 1.."),
    (["--data", TOY_TRANSLATION, "--length-penalty", "inf"], "expected a finite number"),
    (["--data", TOY_TRANSLATION, "--split", "val"], "'val' is not one of"),
])
def test_usage_errors_exit_2(toy_model, args, fragment):
    result = cli(toy_model, *args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_bad_data_content_exits_1(toy_model, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("one is one\t1 la 1\nno tab here\n")
    result = cli(toy_model, "--data", bad)
    assert result.returncode == 1
    assert "--data:" in result.stderr and "line 2 has 0 tabs" in result.stderr


def test_eos_is_what_ends_an_exact_hypothesis():
    from runtime.evaluate import score

    # The reference [5, 6]: a hypothesis cut off at the limit with the same ids is not exact, one that stopped is.
    stopped, cut_off = score([[5, 6]], [[5, 6]], max_len=3), score([[5, 6]], [[5, 6]], max_len=2)
    assert (stopped["exact"], stopped["token"]) == (1.0, 1.0)
    assert (cut_off["exact"], cut_off["token"]) == (0.0, 2 / 3)
    assert score([[5, 7, 6]], [[5, 6]], max_len=9)["token"] == 1 / 3 and EOS not in (5, 6, 7)


def test_a_reference_token_outside_the_vocabulary_is_never_matched():
    from runtime.evaluate import matches, score
    from runtime.specials import UNK

    # The reference "ok w906691059" with the rare word dropped from the vocabulary: [5, <unk>]. A model writing
    # <unk> there is not right, for eval (runtime.evaluate) and for train's held-out figures (the same `matches`).
    unknown = score([[5, UNK]], [[5, UNK]], max_len=9)
    assert (unknown["exact"], unknown["token"]) == (0.0, 2 / 3)
    assert matches([5, UNK, EOS], [5, UNK, EOS], UNK) == (False, 2)
    assert matches([5, 6, EOS], [5, 6, EOS], UNK) == (True, 3)
    assert score([[5, UNK]], [[5, UNK]], max_len=9, unk=None)["exact"] == 1.0  # a vocabulary without an unknown id


@pytest.mark.parametrize("beam_size", [5, 100, 256])
def test_the_beam_line_keeps_a_gap_before_its_figures_at_any_beam(beam_size):
    from runtime.evaluate import format_report

    figures = {"exact": 1.0, "exact_count": 5, "token": 1.0, "sequences_per_s": 100.0}
    report = {"model": "m", "providers": ["CPUExecutionProvider"], "precision": "fp32", "data": "d", "split": "test",
              "sequences": 5,
              "max_decoding_length": 11, "greedy": figures, "target": None,
              "beam": {**figures, "beam_size": beam_size, "length_penalty": 1.0, "never_worse": True, "lost": 0,
                       "gained": 0}}
    line = format_report(report).splitlines()[3]
    assert line.startswith(f"beam {beam_size} ") and f"beam {beam_size} exact" in " ".join(line.split()), line


def test_a_beam_worse_on_some_sequences_says_so_beside_where_it_was_better():
    """Beam search losing a few sequences greedy got right is how beam search goes, not an alarm (it read 'WORSE'
    where beam won 14 and lost 6)."""
    from runtime.evaluate import format_report

    figures = {"exact": 0.5, "exact_count": 50, "token": 0.9, "sequences_per_s": 100.0}
    report = {"model": "m", "providers": ["CPUExecutionProvider"], "precision": "fp32", "data": "d", "split": "test",
              "sequences": 100,
              "max_decoding_length": 11, "greedy": figures, "target": None,
              "beam": {**figures, "beam_size": 5, "length_penalty": 1.0, "never_worse": False, "lost": 6,
                       "gained": 14}}
    assert format_report(report).splitlines()[4] == ("beam vs greedy: worse than greedy on some sequences (greedy "
                                                     "right, beam wrong: 6; beam right, greedy wrong: 14)")


def test_a_length_penalty_without_a_beam_row_is_a_usage_error():
    shipped = Path(__file__).resolve().parents[1] / "artifacts" / "dates"
    result = CliRunner().invoke(main, ["eval", str(shipped), "--data", "dates", "--limit", "2", "--beam", "0",
                                       "--length-penalty", "2"])
    assert result.exit_code == 2 and "--length-penalty: it scores the beam row, which --beam 0 skips" in result.output


def test_a_limit_past_the_split_says_it_scored_them_all(toy_model):
    """--limit 5000 on a split of fewer pairs scored them all without a word (found by a fresh walk)."""
    _, test = load_text_dataset(TOY_TRANSLATION)
    result = cli(toy_model, "--data", TOY_TRANSLATION, "--limit", "5000", "--beam", "0", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sequences"] == len(test.sources)
    assert (f"note: --limit 5000 is more than the {len(test.sources)} pairs of the test split; scoring all "
            f"{len(test.sources)}") in result.stderr
