"""The reliability table, token rows: bad inputs to train / infer / eval / export / verify and the Python API for
token models (the shipped dates model), in the style and with the checks of tests/test_reliability.py: exit code,
one `Error:` line naming the input, no traceback, and every file of the workspace unchanged."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from support.reliability import (
    BAD_INPUT,
    ROOT,
    SHIPPED_MODEL,
    USAGE,
    Case,
    assert_api_refused,
    assert_refused,
    case,
    run_cli,
    workspace_fixtures,
    write,
)

SHIPPED_TOKENS = ROOT / "artifacts" / "dates"
SHIPPED_TOKEN_CHECKPOINT = ROOT / "artifacts" / "dates-checkpoint"
TOK = ("infer", "tokmodel")


def setup_token_workspace(case_dir: Path) -> None:
    """The shipped point and token models, the token checkpoint (whole and damaged), and bad text files."""
    shutil.copytree(SHIPPED_MODEL, case_dir / "model")
    shutil.copytree(SHIPPED_TOKENS, case_dir / "tokmodel")
    shutil.copytree(SHIPPED_TOKEN_CHECKPOINT, case_dir / "tokckpt", ignore=shutil.ignore_patterns("train_state.pt"))
    shutil.copytree(case_dir / "tokckpt", case_dir / "novocab")
    (case_dir / "novocab" / "source_vocab.json").unlink()
    np.save(case_dir / "points.npy", np.zeros((2, 2, 2), dtype=np.float32))
    write(case_dir / "dates.txt", "3/3/15\ntuesday, march 3 2015\n")
    write(case_dir / "long.txt", "1" * 2000 + "\n")
    write(case_dir / "latin1.txt", b"caf\xe9 3/3/15\n")
    write(case_dir / "utf16.txt", "3/3/15\n".encode("utf-16"))
    write(case_dir / "mac.txt", b"3/3/15\r5/6/07\r")
    write(case_dir / "utf16le.txt", "3/3/15\n".encode("utf-16-le"))
    write(case_dir / "bad.tsv", "3/3/15\t2015-03-03\nno tab here\n")
    write(case_dir / "empty.tsv", "\n\n")
    write(case_dir / "notatokenizer.json", '{"hello": 1}\n')


template, workspace = workspace_fixtures("reliability_tokens", setup_token_workspace)


TEXT = ("--text", "3/3/15")
TRANSFORMER = ("--arch", "transformer")
CLI_CASES: dict[str, Case] = {
    # train: text data and token options
    "train --data reversed": case("train", "--data", "reversed", code=USAGE, says=("--data", "'reversed'", "reverse")),
    "train --data missing.tsv": case("train", "--data", "missing.tsv", code=USAGE,
                                     says=("--data", "missing.tsv", "does not exist")),
    "train --data bad.tsv": case("train", "--data", "bad.tsv", "--out", "o", code=BAD_INPUT,
                                 says=("bad.tsv", "line 2", "tabs")),
    "train --data empty.tsv": case("train", "--data", "empty.tsv", "--out", "o", code=BAD_INPUT,
                                   says=("empty.tsv", "no pairs")),
    "train --cell with squares": case("train", "--cell", "lstm", code=USAGE, says=("--cell", "token models")),
    "train --attention additive squares": case("train", "--attention", "additive", code=USAGE,
                                               says=("--attention", "additive", "token models")),
    "train --tokenizer bpe": case("train", "--data", "reverse", "--tokenizer", "bpe", code=USAGE,
                                  says=("--tokenizer", "'bpe'")),
    "train --tokenizer missing.json": case("train", "--data", "reverse", "--tokenizer", "missing.json", code=USAGE,
                                           says=("--tokenizer", "missing.json", "does not exist")),
    "train --tokenizer not a tokenizer": case("train", "--data", "reverse", "--tokenizer", "notatokenizer.json",
                                              "--out", "o", code=BAD_INPUT, says=("notatokenizer.json", "tokenizers")),
    "train --heads 3 --hidden-dim 8": case("train", "--data", "reverse", "--attention", "multihead", "--heads", "3",
                                           "--hidden-dim", "8", code=USAGE, says=("--heads", "not a multiple")),
    "train --hidden-dim 5000": case("train", "--data", "reverse", "--hidden-dim", "5000", code=USAGE,
                                    says=("--hidden-dim", "5000")),
    "train --layers 9": case("train", "--data", "reverse", "--layers", "9", code=USAGE, says=("--layers", "9")),
    "train --label-smoothing 1": case("train", "--data", "reverse", "--label-smoothing", "1", code=USAGE,
                                      says=("--label-smoothing", "1")),
    "train --lr-decay 0": case("train", "--data", "reverse", "--lr-decay", "0", code=USAGE, says=("--lr-decay",)),
    # train: the transformer's options, and options of the other arch or kind
    "train --arch bogus": case("train", "--data", "reverse", "--arch", "bogus", code=USAGE,
                               says=("--arch", "'bogus'", "recurrent", "transformer")),
    "train --d-model 0": case("train", "--data", "reverse", *TRANSFORMER, "--d-model", "0", code=USAGE,
                              says=("--d-model", "0")),
    "train --heads 3 --d-model 64": case("train", "--data", "reverse", *TRANSFORMER, "--d-model", "64", "--heads",
                                         "3", code=USAGE, says=("--heads", "--d-model 64", "not a multiple of 3")),
    "train --heads 4 --d-model 30": case("train", "--data", "reverse", *TRANSFORMER, "--d-model", "30", code=USAGE,
                                         says=("--heads", "--d-model 30", "not a multiple of 4")),  # default heads
    "train --d-ff 0": case("train", "--data", "reverse", *TRANSFORMER, "--d-ff", "0", code=USAGE,
                           says=("--d-ff", "0")),
    "train --dropout 1.0": case("train", "--data", "reverse", *TRANSFORMER, "--dropout", "1.0", code=USAGE,
                                says=("--dropout", "1.0")),
    "train --dropout -0.1": case("train", "--data", "reverse", *TRANSFORMER, "--dropout", "-0.1", code=USAGE,
                                 says=("--dropout", "-0.1")),
    "train --dropout nan": case("train", "--data", "reverse", *TRANSFORMER, "--dropout", "nan", code=USAGE,
                                says=("--dropout", "finite")),
    "train --norm x": case("train", "--data", "reverse", *TRANSFORMER, "--norm", "x", code=USAGE,
                           says=("--norm", "'x'", "pre")),
    "train --positional x": case("train", "--data", "reverse", *TRANSFORMER, "--positional", "x", code=USAGE,
                                 says=("--positional", "'x'", "sinusoidal")),
    "train --warmup -1": case("train", "--data", "reverse", "--warmup", "-1", code=USAGE, says=("--warmup", "-1")),
    "train transformer --cell": case("train", "--data", "reverse", *TRANSFORMER, "--cell", "lstm", code=USAGE,
                                     says=("--cell", "recurrent", "--arch transformer")),
    "train transformer --hidden-dim": case("train", "--data", "reverse", *TRANSFORMER, "--hidden-dim", "64",
                                           code=USAGE, says=("--hidden-dim", "recurrent", "--d-model")),
    "train transformer --embedding-dim": case("train", "--data", "reverse", *TRANSFORMER, "--embedding-dim", "8",
                                              code=USAGE, says=("--embedding-dim", "recurrent", "--d-model")),
    "train transformer --bidirectional": case("train", "--data", "reverse", *TRANSFORMER, "--no-bidirectional",
                                              code=USAGE, says=("'--no-bidirectional'", "recurrent")),  # as given
    "train points --no-bidirectional": case("train", "--no-bidirectional", code=USAGE,
                                            says=("'--no-bidirectional'", "point model")),
    "train transformer --attention": case("train", "--data", "reverse", *TRANSFORMER, "--attention", "multihead",
                                          code=USAGE, says=("--attention", "recurrent", "--arch transformer")),
    "train recurrent --d-model": case("train", "--data", "reverse", "--d-model", "64", code=USAGE,
                                      says=("--d-model", "transformers", "--arch transformer")),
    "train recurrent --norm": case("train", "--data", "reverse", "--arch", "recurrent", "--norm", "post",
                                   code=USAGE, says=("--norm", "transformers", "--arch recurrent")),
    "train recurrent --dropout": case("train", "--data", "dates", "--dropout", "0.1", code=USAGE,
                                      says=("--dropout", "transformers")),
    "train squares --arch transformer": case("train", *TRANSFORMER, code=USAGE,
                                             says=("--arch", "token models", "point model")),
    "train squares --d-ff": case("train", "--d-ff", "64", code=USAGE, says=("--d-ff", "transformer", "point model")),
    "train squares --positional": case("train", "--data", "squares", "--positional", "learned", code=USAGE,
                                       says=("--positional", "point model")),
    "train squares --warmup": case("train", "--warmup", "10", code=USAGE, says=("--warmup", "point model")),
    # infer: kind mismatches
    "infer token model, points input": case(*TOK, "--input", "points.npy", code=USAGE,
                                            says=("points.npy", "token model", "one input per line")),
    "infer point model, --text": case("infer", "model", *TEXT, code=USAGE, says=("--text", "point model")),
    "infer point model, --beam": case("infer", "model", "--input", "points.npy", "--beam", "3", code=USAGE,
                                      says=("point model",)),
    "infer token model, --target-len": case(*TOK, *TEXT, "--target-len", "3", code=USAGE,
                                            says=("--target-len", "token model", "--max-len")),
    "infer token model, no input": case(*TOK, code=USAGE, says=("token model", "--text", "--input")),
    # a file option given twice: click kept the last, and the first file was never read (or written)
    "infer --input twice": case(*TOK, "--input", "a.txt", "--input", "b.txt", code=USAGE,
                                says=("--input given twice ('a.txt', then 'b.txt'); it names one path",)),
    "infer --output twice": case(*TOK, *TEXT, "--output", "a.jsonl", "--output=b.jsonl", code=USAGE,
                                 says=("--output given twice ('a.jsonl', then 'b.jsonl')",)),
    "train --data twice": case("train", "--data", "dates", "--data", "reverse", "--out", "o", code=USAGE,
                               says=("--data given twice ('dates', then 'reverse')",)),
    "export --out twice": case("export", "ckpt", "--out", "a", "--out", "b", code=USAGE,
                               says=("--out given twice ('a', then 'b')",)),
    # infer: bad texts and options
    "infer --text blank": case(*TOK, "--text", " ", code=USAGE, says=("--text #1", "blank")),
    "infer --text not UTF-8": case(*TOK, "--text", "3/3/15", "--text", "\u00e9t\u00e9 caf\udce9", "--plot", "att.png",
                                   code=USAGE, says=("--text #2", "not UTF-8 (byte 0xe9 at offset 9)")),
    "infer over-long line": case(*TOK, "--input", "long.txt", code=BAD_INPUT, says=("long.txt", "line 1", "1024")),
    "infer not UTF-8": case(*TOK, "--input", "latin1.txt", code=BAD_INPUT, says=("latin1.txt", "line 1", "UTF-8")),
    "infer UTF-16": case(*TOK, "--input", "utf16.txt", code=BAD_INPUT,
                         says=("utf16.txt line 1: not UTF-8 (byte 0xff at offset 0) (it starts with UTF-16's "
                               "byte-order mark: it is UTF-16); save the file as UTF-8",)),
    # decoded with exit 0: each NUL read as an unknown token, a wrong date and a note
    "infer UTF-16 without its BOM": case(*TOK, "--input", "utf16le.txt", code=BAD_INPUT,
                                         says=("utf16le.txt line 1, character 1: a NUL byte: UTF-16 text without its "
                                               "byte-order mark? save the file as UTF-8",)),
    # one input of the whole file, each \r read as the unknown token: a wrong date and a note
    "infer \\r-only line ends": case(*TOK, "--input", "mac.txt", code=BAD_INPUT,
                                    says=("mac.txt line 1, character 6: a carriage return (\\r) that ends no "
                                          "line", "tr '\\r' '\\n'")),
    "infer --beam 0": case(*TOK, *TEXT, "--beam", "0", code=USAGE, says=("--beam", "0")),
    "infer --n-best > --beam": case(*TOK, *TEXT, "--beam", "2", "--n-best", "3", code=USAGE,
                                    says=("--n-best 3", "--beam 2")),
    "infer --seed 2**64": case(*TOK, *TEXT, "--sample", "--seed", str(1 << 64), code=USAGE,
                               says=("--seed", "0<=x<=18446744073709551615")),
    "infer --top-k without --sample": case(*TOK, *TEXT, "--top-k", "3", code=USAGE, says=("--top-k", "--sample")),
    "infer --sample --beam 2": case(*TOK, *TEXT, "--sample", "--beam", "2", code=USAGE, says=("--sample", "--beam")),
    "infer --top-p 0": case(*TOK, *TEXT, "--sample", "--top-p", "0", code=USAGE, says=("--top-p", "0")),
    "infer --top-p subnormal": case(*TOK, *TEXT, "--sample", "--top-p", "1e-320", code=USAGE,
                                    says=("--top-p", "'1e-320' is below 2.225e-308", "reads a smaller one as 0")),
    "infer --temperature subnormal": case(*TOK, *TEXT, "--sample", "--temperature", "5e-324", code=USAGE,
                                          says=("--temperature", "'5e-324' is below 2.225e-308")),
    "infer --top-p 1.5": case(*TOK, *TEXT, "--sample", "--top-p", "1.5", code=USAGE, says=("--top-p", "1.5")),
    "infer --temperature 0": case(*TOK, *TEXT, "--sample", "--temperature", "0", code=USAGE,
                                  says=("--temperature", "0")),
    "infer --temperature nan": case(*TOK, *TEXT, "--sample", "--temperature", "nan", code=USAGE,
                                    says=("--temperature", "finite")),
    "infer --length-penalty greedy": case(*TOK, *TEXT, "--length-penalty", "0.5", code=USAGE,
                                          says=("--length-penalty", "--beam")),
    # it said "add --beam N", which --sample refuses in turn (found by a fresh walk)
    "infer --length-penalty sampling": case(*TOK, *TEXT, "--sample", "--length-penalty", "0.5", code=USAGE,
                                            says=("--length-penalty", "drop --length-penalty, or drop --sample")),
    "infer --min-len > --max-len": case(*TOK, *TEXT, "--min-len", "7", "--max-len", "6", code=USAGE,
                                        says=("--min-len 7", "6")),
    "infer --output .json for tokens": case(*TOK, *TEXT, "--output", "out.json", code=USAGE,
                                            says=("--output", ".jsonl")),
    "infer --length-penalty 1000": case(*TOK, *TEXT, "--beam", "5", "--length-penalty", "1000", code=USAGE,
                                        says=("--length-penalty", "-50<=x<=50", "1000")),
    # infer --ray: refused before Ray is imported or started
    "infer --ray --plot": case(*TOK, *TEXT, "--ray", "--output", "o.jsonl", "--plot", "p.png", code=USAGE,
                               says=("--plot", "--ray")),
    "infer --ray without --output": case(*TOK, *TEXT, "--ray", code=USAGE, says=("--ray", "--output FILE.jsonl")),
    "infer --ray --device-id": case(*TOK, *TEXT, "--ray", "--output", "o.jsonl", "--device-id", "1", code=USAGE,
                                    says=("--device-id", "Ray")),
    "infer --ray --concurrency 0": case(*TOK, *TEXT, "--ray", "--output", "o.jsonl", "--concurrency", "0",
                                        code=USAGE, says=("--concurrency", "0")),
    "infer --ray --concurrency past the CPUs": case(*TOK, *TEXT, "--ray", "--output", "o.jsonl", "--concurrency",
                                                    "999", code=BAD_INPUT,
                                                    says=("--concurrency 999", "do not fit this machine's", "lower it")),
    **{f"infer --ray --address {value}": case(*TOK, *TEXT, "--ray", "--output", "o.jsonl", "--address", value,
                                             code=USAGE, says=("--address", "expected HOST:PORT of a Ray cluster's "
                                                               "head (port 1-65535)", repr(value)))
       for value in ("garbage", "127.0.0.1:99999", "127.0.0.1:0", ":6379", "ray://head", "127.0.0.1:\u00b2",
                     " 127.0.0.1:6379")},
    "infer --address without --ray": case(*TOK, *TEXT, "--address", "127.0.0.1:6379", code=USAGE,
                                          says=("--address", "add --ray")),
    # eval, export, verify
    "eval point model": case("eval", "model", "--data", "dates", code=BAD_INPUT, says=("point model",)),
    "eval --data nosuch": case("eval", "tokmodel", "--data", "nosuch", code=USAGE, says=("--data", "'nosuch'")),
    "eval --data of three names": case("eval", "tokmodel", "--data", "a,b,c", code=USAGE,
                                       says=("--data", "two files 'SRC_PATH,TGT_PATH' (names without a ','")),
    "eval --data bad.tsv": case("eval", "tokmodel", "--data", "bad.tsv", code=BAD_INPUT, says=("bad.tsv", "line 2")),
    "export token ckpt without vocab": case("export", "novocab", "--out", "o", code=BAD_INPUT,
                                            says=("source_vocab.json", "missing")),
    "verify token pair, --data squares": case("verify", "tokckpt", "tokmodel", "--data", "squares", code=USAGE,
                                              says=("--data", "point data", "token model")),
    "verify checkpoint vs other kind": case("verify", "tokckpt", "model", code=BAD_INPUT,
                                            says=("model", "cannot be compared")),
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_refuses(workspace: Path, name: str) -> None:
    assert_refused(workspace, CLI_CASES[name])


def test_unknown_characters_are_read_as_unk_not_refused(workspace: Path) -> None:
    result = run_cli(workspace, case(*TOK, "--text", "3/3/15 \u00e9\u00e9", code=0, says=()))
    assert result.returncode == 0 and '"hypotheses"' in result.stdout, result.stderr


# ---- the Python API ---------------------------------------------------------------------------------------------

def _model(case_dir: Path, name: str = "tokmodel") -> Any:
    from runtime.model import Seq2Seq

    return Seq2Seq.load(case_dir / name)


def Seq2Seq_load(path: Path, **options: Any) -> Any:  # noqa: N802 - Seq2Seq.load, imported when called
    from runtime.model import Seq2Seq

    return Seq2Seq.load(path, **options)


def _translate(texts: Any, **options: Any) -> Callable[[Path], Any]:
    return lambda d: _model(d).translate_batch(texts, **options)


API_CASES: dict[str, tuple[Callable[[Path], Any], tuple[str, ...]]] = {
    "translate one string": (_translate("3/3/15"), ("texts", "list of strings")),
    "translate empty text": (_translate([""]), ("texts[0]", "non-empty")),
    "translate a number": (_translate([3]), ("texts[0]", "non-empty string")),
    "translate over-long": (_translate(["1" * 2000]), ("texts[0]", "1024")),
    "translate beam_size 0": (_translate(["3/3/15"], beam_size=0), ("beam_size",)),
    "translate num_hypotheses > beam": (_translate(["3/3/15"], beam_size=2, num_hypotheses=3), ("num_hypotheses",)),
    "translate topp 1.5": (_translate(["3/3/15"], sampling_topp=1.5), ("sampling_topp",)),
    "translate temperature 0": (_translate(["3/3/15"], sampling_temperature=0.0), ("sampling_temperature",)),
    "translate sampling with beam": (_translate(["3/3/15"], beam_size=2, sampling_topk=3), ("beam_size", "sampling")),
    "translate unknown option": (_translate(["3/3/15"], beam=2), ("unknown options", "beam",
                                                                  "'return_attention', 'cancel']")),
    "translate sampling with an n-best": (_translate(["3/3/15"], sampling_topk=5, num_hypotheses=3, seed=1),
                                          ("num_hypotheses", "sampling draws one output per text",
                                           "pass num_hypotheses=1")),  # (it advised a wider beam, then refused it)
    "translate min_decoding_length past the default max": (
        _translate(["3/3/15"], min_decoding_length=20),
        ("min_decoding_length 20", "max_decoding_length, which was not given: its default is",
         "pass max_decoding_length >= 20 too")),
    "translate max_decoding_length 10001": (_translate(["3/3/15"], max_decoding_length=10_001),
                                            ("max_decoding_length", "10000")),
    "translate length_penalty past float64": (_translate(["3/3/15"], beam_size=2, length_penalty=2**2000),
                                              ("length_penalty", "finite float")),
    "translate topk an array": (_translate(["3/3/15"], sampling_topk=np.array([1, 2])), ("sampling_topk", "int")),
    "translate topp an array": (_translate(["3/3/15"], sampling_topp=np.array([1.0, 0.5])), ("sampling_topp",)),
    "translate topk True": (_translate(["3/3/15"], sampling_topk=True), ("sampling_topk", "True")),
    "translate seed 'x', greedy": (_translate(["3/3/15"], seed="x"), ("seed", "int in [0, 18446744073709551615]",
                                                                      "'x'")),
    "translate seed 2**64": (_translate(["3/3/15"], sampling_topk=0, seed=1 << 64), ("seed", str(1 << 64))),
    "translate no texts, topk -1": (_translate([], sampling_topk=-1), ("sampling_topk", "-1")),
    "translate no texts, temperature -1": (_translate([], sampling_temperature=-1.0), ("sampling_temperature",)),
    "translate cancel 5": (_translate(["3/3/15"], cancel=5), ("cancel", "function of no arguments", "5")),
    "translate cancel of one argument": (_translate(["3/3/15"], cancel=lambda stop: False),
                                         ("cancel", "function of no arguments")),
    "translate no texts, cancel of one argument": (_translate([], cancel=lambda stop: False),
                                                   ("cancel", "function of no arguments", "missing a required")),
    "translate cancel answers an array": (_translate(["3/3/15"], cancel=lambda: np.array([True, False])),
                                          ("cancel", "True or False", "array")),
    # ints past the 4,300 digits Python will print: quoting them in the message raised ValueError instead
    "translate max_decoding_length 10**5000": (_translate(["3/3/15"], max_decoding_length=10**5000),
                                               ("max_decoding_length", "an int of about 5001 digits", "<= 10000")),
    "translate min_decoding_length 10**5000": (_translate(["3/3/15"], min_decoding_length=10**5000),
                                               ("min_decoding_length an int of about 5001 digits",)),
    "translate num_hypotheses 10**5000": (_translate(["3/3/15"], beam_size=2, num_hypotheses=10**5000),
                                          ("num_hypotheses", "got an int of about 5001 digits")),
    "translate sampling num_hypotheses 10**5000": (
        _translate(["3/3/15"], sampling_topk=0, num_hypotheses=10**5000),
        ("num_hypotheses", "num_hypotheses an int of about 5001 digits cannot be met")),
    "load threads 10**5000": (lambda d: Seq2Seq_load(d / "tokmodel", threads=10**5000),
                              ("threads: an int of about 5001 digits", "pass at most")),
    "load workers 10**5000": (lambda d: Seq2Seq_load(d / "tokmodel", workers=10**5000),
                              ("workers: an int of about 5001 digits",)),
    "translate on a point model": (lambda d: _model(d, "model").translate_batch(["3/3/15"]), ("point model",)),
    "predict on a token model": (lambda d: _model(d).predict(np.zeros((1, 2, 2))), ("token model",
                                                                                      "translate_batch")),
}


@pytest.mark.parametrize("name", list(API_CASES))
def test_api_refuses(workspace: Path, name: str) -> None:
    from runtime.errors import InputError

    call, fragments = API_CASES[name]
    assert_api_refused(workspace, call, InputError, fragments)


def _decode(ids: Any) -> Callable[[Path], Any]:
    return lambda d: _model(d).vocabularies["target"].decode(ids)


VOCAB_CASES: dict[str, tuple[Callable[[Path], Any], tuple[str, ...]]] = {
    "decode an id past the vocabulary": (_decode([4, 10**6]), ("ids[1]", "1000000")),
    "decode True among ids": (_decode([4, True]), ("ids[1]", "True")),
    "decode 1.5 among ids": (_decode([4, 1.5]), ("ids[1]", "1.5")),
    "decode a bare int": (_decode(5), ("ids", "sequence of ints", "5")),
    "decode rows": (_decode([[4, 5], [6]]), ("one sequence", "rows one at a time")),
    "encode_batch width -1": (lambda d: _model(d).vocabularies["source"].encode_batch(["3"], width=-1),
                              ("width", ">= 0", "-1")),
}


@pytest.mark.parametrize("name", list(VOCAB_CASES))
def test_vocabulary_refuses(workspace: Path, name: str) -> None:
    from runtime.errors import VocabError

    call, fragments = VOCAB_CASES[name]
    assert_api_refused(workspace, call, VocabError, fragments)


def test_only_file_options_are_refused_twice_and_a_value_is_never_read_as_an_option():
    """Other options keep click's rule, the last counts (scripts append overrides to their defaults); a --text whose
    value is '--input' is a text, not a second --input."""
    import json

    from click.testing import CliRunner

    from cli.main import main

    dates = str(Path(__file__).resolve().parents[1] / "artifacts" / "dates")
    done = CliRunner().invoke(main, ["infer", dates, "--text", "--input", "--beam", "2", "--beam", "3", "--n-best", "3",
                                     "--threads", "1"])
    assert done.exit_code == 0, done.output
    (line,) = [json.loads(text) for text in done.output.splitlines() if text.startswith("{")]
    assert line["source"] == "--input" and len(line["hypotheses"]) == 3  # --beam 3 counted: an n-best of 3
