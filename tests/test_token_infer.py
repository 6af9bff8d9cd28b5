"""`seq2onnx infer` on token models, through real subprocesses: texts, files and stdin in, JSON lines out, exactly
as `Seq2Seq.translate_batch` decodes them; every mismatch is one line and the documented exit code."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.declared import Sources
from runtime.infer_records import heatmap
from runtime.infer_tokens import Item, batch_seed
from runtime.model import Seq2Seq
from runtime.plot import Heatmap
from runtime.tokens import Translation
from runtime.vocab import Vocabulary
from training.tokens.builtin import toy_translation

from support.models import export_token_model, toy_token_spec
from support.processes import default_stops

PAIRS, _ = toy_translation()  # the nine notebook pairs
TEXTS = ["one is one", "two is three", "nine is nine"]
TARGET_LEN = 6
SCORE_ATOL = 1e-5  # float32 graphs; a different batch may pad differently, and summed log-probs may drift this much
USAGE, BAD_INPUT = 2, 1
SQUARES = Path(__file__).resolve().parents[1] / "artifacts" / "squares"
NO_TORCH = "import sys; sys.modules['torch'] = None; from cli.main import main; sys.argv[0] = 'seq2onnx'; main()"
PIPE_ANSWER_S = 60  # a child's start-up and one decode; without an answer in this long, it waits for more input
SETTLE_S = 0.5  # after the last answer, for the child to be back waiting on stdin
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(*args: object, stdin: str | bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`seq2onnx ARGS` in a child interpreter where `import torch` fails, as on a runtime-only install."""
    return subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], input=stdin, capture_output=True,
                          text=not isinstance(stdin, bytes), timeout=300, cwd=cwd)


def records(result: subprocess.CompletedProcess) -> list[dict]:
    """The JSON lines of a successful run."""
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def assert_matches(found: list[dict], expected: list[list[Translation]]) -> None:
    """JSON records hold the same hypotheses (ids exact, scores within SCORE_ATOL) in the same order."""
    assert len(found) == len(expected)
    for record, hyps in zip(found, expected):
        assert [h["tokens"] for h in record["hypotheses"]] == [t.tokens for t in hyps]
        assert [h["text"] for h in record["hypotheses"]] == [t.text for t in hyps]
        for key in ("score", "log_prob"):
            np.testing.assert_allclose([h[key] for h in record["hypotheses"]], [getattr(t, key) for t in hyps],
                                       rtol=0, atol=SCORE_ATOL)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Seeded, untrained GRU token models that read their sources reversed: with attention, and without."""
    root = tmp_path_factory.mktemp("token_infer")
    out = {}
    for attention in ("additive", "none"):
        spec = toy_token_spec(cell="gru", attention=attention, hidden_dim=8, embedding_dim=6, target_len=TARGET_LEN,
                              reverse_source=True)
        out[attention] = export_token_model(spec, root / attention).path
    return out


@pytest.fixture(scope="module")
def runtime(models: dict[str, Path]) -> Seq2Seq:
    return Seq2Seq.load(models["additive"], provider="cpu")


def test_text_file_and_stdin_give_what_translate_batch_gives(models, runtime, tmp_path):
    expected = runtime.translate_batch(TEXTS)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    from_text = records(cli("infer", models["additive"], *(a for t in TEXTS for a in ("--text", t))))
    from_file = records(cli("infer", models["additive"], "--input", tmp_path / "in.txt"))
    from_stdin = records(cli("infer", models["additive"], "--input", "-", stdin="\r\n".join(TEXTS)))
    for found in (from_text, from_file, from_stdin):
        assert [r["index"] for r in found] == [0, 1, 2] and [r["source"] for r in found] == TEXTS
        assert_matches(found, expected)
        assert all("attention" not in h for r in found for h in r["hypotheses"])


def test_json_lines_are_utf8_text_whatever_the_locale(models, runtime, tmp_path):
    """Text in the records is written as it is, in UTF-8 (the JSON Lines format), on stdout and in --output: it was
    escaped to ASCII (\\u00e9), which a reader of a transliteration's output could not read. stdout takes UTF-8 even
    where the locale's encoding is ASCII, which could not hold the letters."""
    text = "one is n\u00efne \u65e5\u672c \u2028 \x85"  # and two a line splitter breaks at: escaped
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}
    shown = subprocess.run([sys.executable, "-c", NO_TORCH, "infer", str(models["additive"]), "--text", text],
                           capture_output=True, timeout=300, env=env)
    assert shown.returncode == 0, shown.stderr.decode(errors="replace")
    out = tmp_path / "out.jsonl"
    written = cli("infer", models["additive"], "--text", text, "--output", out)
    assert written.returncode == 0, written.stderr
    written_text = "one is n\u00efne \u65e5\u672c \\u2028 \\u0085"
    for raw in (shown.stdout, out.read_bytes()):
        assert f'"source": "{written_text}"'.encode() in raw and raw.count(b"\\u") == 2, raw
        (found,) = (json.loads(line) for line in raw.decode("utf-8").splitlines())
        assert found["source"] == text
        assert_matches([found], runtime.translate_batch([text]))


def test_blank_lines_are_skipped_and_keep_their_numbers(models, runtime, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbfone is one\n\n   \nnine is nine")
    result = cli("infer", models["additive"], "--input", tmp_path / "in.txt")
    found = records(result)
    assert [r["index"] for r in found] == [0, 3] and found[0]["source"] == "one is one"  # BOM dropped
    assert "skipped 2 blank line(s) (line 2, 3)" in result.stderr
    assert_matches(found, runtime.translate_batch(["one is one", "nine is nine"]))


def test_unknown_words_decode_as_unk(models, runtime):
    found = records(cli("infer", models["additive"], "--text", "zebra is one"))
    assert_matches(found, runtime.translate_batch(["zebra is one"]))


def test_n_best_lists_are_complete_and_best_first(models, runtime):
    found = records(cli("infer", models["additive"], "--beam", "4", "--n-best", "3", "--text", TEXTS[0],
                        "--text", TEXTS[1]))
    assert all(len(r["hypotheses"]) == 3 for r in found)
    for r in found:
        scores = [h["score"] for h in r["hypotheses"]]
        assert scores == sorted(scores, reverse=True)
    assert_matches(found, runtime.translate_batch(TEXTS[:2], beam_size=4, num_hypotheses=3))


def test_seeded_sampling_is_reproducible(models, runtime, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(PAIRS.sources), encoding="utf-8")
    args = ("infer", models["additive"], "--input", tmp_path / "in.txt", "--sample", "--temperature", "2")
    first, again = records(cli(*args, "--seed", "7")), records(cli(*args, "--seed", "7"))
    assert first == again
    assert_matches(first, runtime.translate_batch(list(PAIRS.sources), sampling_topk=0, sampling_temperature=2.0,
                                                  seed=batch_seed(7, 0)))
    assert records(cli(*args, "--seed", "8")) != first  # 9 inputs x 6 near-uniform draws: equal by chance ~never
    (tmp_path / "same.txt").write_text("one is one\n" * 4, encoding="utf-8")
    one_per_batch = records(cli(*args[:3], tmp_path / "same.txt", *args[4:], "--seed", "7", "--batch-size", "1"))
    assert len({tuple(r["hypotheses"][0]["tokens"]) for r in one_per_batch}) > 1  # batches do not repeat one draw


@pytest.mark.parametrize("decoding", [(), ("--beam", "3", "--n-best", "2")])
def test_batch_size_chunks_decode_like_one_batch(models, runtime, tmp_path, decoding):
    (tmp_path / "in.txt").write_text("\n".join(PAIRS.sources), encoding="utf-8")
    args = ("infer", models["additive"], "--input", tmp_path / "in.txt", *decoding)
    whole = records(cli(*args, "--batch-size", "64"))
    chunked = cli(*args, "--batch-size", "2", "--output", tmp_path / "out.jsonl")
    assert chunked.returncode == 0, chunked.stderr
    assert "infer: 4 inputs decoded" in chunked.stderr and "infer: 9 inputs decoded" in chunked.stderr
    assert chunked.stderr.count("inputs decoded") < 5  # of 5 batches: the second, the last, one every 2 s
    in_chunks = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["index"] for r in in_chunks] == list(range(9))
    options = dict(beam_size=3, num_hypotheses=2) if decoding else {}
    expected = runtime.translate_batch(list(PAIRS.sources), **options)  # one batch of nine
    assert_matches(whole, expected)
    assert_matches(in_chunks, expected)


def test_a_tsv_input_is_decoded_whole_line_with_a_note_pointing_at_eval(models, tmp_path):
    (tmp_path / "pairs.TSV").write_text(f"{PAIRS.sources[0]}\t{PAIRS.targets[0]}\n", encoding="utf-8")
    done = cli("infer", models["additive"], "--input", tmp_path / "pairs.TSV")
    assert [r["source"] for r in records(done)] == [f"{PAIRS.sources[0]}\t{PAIRS.targets[0]}"]
    assert "infer reads one source text per line, the whole line" in done.stderr
    assert f"seq2onnx eval {models['additive']} --data {tmp_path / 'pairs.TSV'}" in done.stderr


def test_a_jsonl_input_is_decoded_whole_line_with_a_note(models, tmp_path):
    """infer's own --output fed back as --input: each JSON line was decoded as a text, braces and all, and only the
    unknown-token note hinted at it (found by a fresh walk)."""
    (tmp_path / "out.jsonl").write_text('{"text": "one two"}\n', encoding="utf-8")
    done = cli("infer", models["additive"], "--input", tmp_path / "out.jsonl")
    assert [r["source"] for r in records(done)] == ['{"text": "one two"}']
    assert (f"note: --input {tmp_path / 'out.jsonl'}: infer reads one source text per line, the whole line; a JSON "
            "line's braces, keys and quotes would be read as part of each source") in done.stderr, done.stderr


@pytest.mark.parametrize("stop", [False, True])
def test_a_batch_read_from_a_pipe_is_answered_before_the_next_line_comes(models, runtime, stop):
    # A program feeding one line and waiting for its answer: each full batch is decoded at once, none read ahead.
    # Ctrl-C then says how many results it had printed.
    proc = subprocess.Popen([sys.executable, "-c", NO_TORCH, "infer", str(models["additive"]), "--input", "-",
                             "--batch-size", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_stops)
    answers: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [answers.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        for text in PAIRS.sources[:3]:
            proc.stdin.write(text + "\n")
            proc.stdin.flush()
            answer = json.loads(answers.get(timeout=PIPE_ANSWER_S))  # queue.Empty: it waited for the next line
            assert answer["source"] == text
            assert answer["hypotheses"][0]["text"] == runtime.translate_batch([text])[0][0].text
        if stop:
            time.sleep(SETTLE_S)  # the child counts a line once its write returns: a stop within it may miss one
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=PIPE_ANSWER_S) == 130
            said = proc.stderr.read()
            assert "it had printed 3 results to stdout (a JSON line each), and written nothing else" in said, said
            return
        proc.stdin.close()
        assert proc.wait(timeout=PIPE_ANSWER_S) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_output_is_written_whole_and_never_replaced_without_force(models, tmp_path):
    out = tmp_path / "out.jsonl"
    written = cli("infer", models["additive"], "--text", TEXTS[0], "--output", out)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    before = out.read_bytes()
    assert json.loads(before)["source"] == TEXTS[0]
    refused = cli("infer", models["additive"], "--text", TEXTS[1], "--output", out)
    assert refused.returncode == BAD_INPUT and "already exists there; pass --force" in refused.stderr
    assert out.read_bytes() == before
    (tmp_path / "in.txt").write_text("one is one\n" + "one " * 2000 + "\n", encoding="utf-8")
    failed = cli("infer", models["additive"], "--input", tmp_path / "in.txt", "--output", out, "--force",
                 "--batch-size", "1")
    assert failed.returncode == BAD_INPUT and "line 2" in failed.stderr
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl"]
    forced = cli("infer", models["additive"], "--text", TEXTS[1], "--output", out, "--force")
    assert forced.returncode == 0 and json.loads(out.read_bytes())["source"] == TEXTS[1]


def test_attention_json_and_plot(models, runtime, tmp_path):
    plot = tmp_path / "attention.png"
    result = cli("infer", models["additive"], "--text", "two is one", "--text", "zebra is nine", "--attention",
                 "--plot", plot)
    found = records(result)
    assert found[0]["source_tokens"] == ["one", "is", "two", "</s>"]  # the order the model read them
    expected = runtime.translate_batch(["two is one", "zebra is nine"], return_attention=True)
    for record, hyps in zip(found, expected):
        attention = np.asarray(record["hypotheses"][0]["attention"])
        assert attention.shape == (len(hyps[0].tokens), len(record["source_tokens"]))
        np.testing.assert_allclose(attention, hyps[0].attention[:, :attention.shape[1]], atol=1e-6)
    assert plot.read_bytes()[:8] == PNG_MAGIC and f"wrote {plot}" in result.stderr


def test_heatmap_columns_are_in_reading_order():
    vocab = Vocabulary.build(["one is two"], "whitespace")
    weights = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.0, 0.5, 0.0]], np.float32)  # columns: two is zebra </s>
    best = Translation("1 la", ["1", "la"], [4, 5], -1.0, -1.0, weights, finish_reason="eos")
    drawn = heatmap(Item(4, "zebra is two", "--text #5"), best, vocab, Sources(reverse=True), max_len=TARGET_LEN)
    assert isinstance(drawn, Heatmap) and drawn.column_labels == ["zebra*", "is", "two", "</s>"]
    np.testing.assert_array_equal(drawn.weights, weights[:, [2, 1, 0, 3]])
    assert drawn.row_labels == ["1", "la"] and "input 4: zebra is two" in drawn.title
    assert "unknown to the model" in drawn.column_name


@pytest.mark.parametrize(("args", "code", "fragments"), [
    (("--text", "one is one", "--input", "-"), USAGE, ["either with --text", "both were given"]),
    ((), USAGE, ["is a token model", "--text TEXT"]),
    (("--input", "{npy}"), USAGE, ["is a token model, which reads UTF-8 text, one input per line"]),
    (("--text", "one", "--target-len", "3"), USAGE, ["--target-len", "bound their length with --max-len"]),
    (("--text", "one", "--beam", "0"), USAGE, ["--beam", "0 is not in the range"]),
    (("--text", "one", "--beam", "2", "--n-best", "3"), USAGE, ["--n-best 3 is more than --beam 2"]),
    (("--text", "one", "--top-k", "5"), USAGE, ["--top-k sets how --sample draws", "add --sample"]),
    (("--text", "one", "--sample", "--beam", "2"), USAGE, ["--sample", "cannot search a beam"]),
    (("--text", "one", "--sample", "--top-p", "1.5"), USAGE, ["--top-p", "0<x<=1"]),
    (("--text", "one", "--sample", "--top-p", "0"), USAGE, ["--top-p", "0<x<=1"]),
    (("--text", "one", "--sample", "--temperature", "0"), USAGE, ["--temperature", "x>0"]),
    (("--text", "one", "--sample", "--temperature", "nan"), USAGE, ["--temperature", "finite"]),
    (("--text", "one", "--length-penalty", "0.6"), USAGE, ["--length-penalty ranks", "--beam N"]),
    (("--text", "one", "--min-len", "7"), USAGE, ["--min-len 7 is more than the output bound 6"]),
    (("--text", "one", "--text", " "), USAGE, ["--text #2 is blank"]),
    (("--text", "one", "--output", "out.json"), USAGE, ["--output", ".jsonl"]),
    (("--text", "one " * 1100), BAD_INPUT, ["--text #1: 1101 tokens", "more than the 1024"]),
    (("--input", "{long}"), BAD_INPUT, ["long.txt line 2: 1201 tokens", "split it"]),
    (("--input", "{latin1}"), BAD_INPUT, ["latin1.txt line 1: not UTF-8 (byte 0xe9", "save the file as UTF-8"]),
])
def test_token_mismatches_are_one_line_with_their_exit_code(models, tmp_path, args, code, fragments):
    np.save(tmp_path / "points.npy", np.zeros((1, 2, 2), np.float32))
    (tmp_path / "long.txt").write_text("one is one\n" + "one " * 1200 + "\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 is one\n".encode("latin-1"))
    args = [str(a).format(npy=tmp_path / "points.npy", long=tmp_path / "long.txt", latin1=tmp_path / "latin1.txt")
            for a in args]
    result = cli("infer", models["additive"], *args, stdin="", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert list(tmp_path.glob("out*")) == []


@pytest.mark.parametrize("flag", [("--attention",), ("--plot", "p.png")])
def test_a_model_without_attention_refuses_attention_and_plot(models, tmp_path, flag):
    result = cli("infer", models["none"], "--text", "one is one", *flag, cwd=tmp_path)
    assert result.returncode == BAD_INPUT and "has no attention" in result.stderr and flag[0] in result.stderr
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("args", [("--text", "one is one"), ("--input", "-", "--beam", "2"),
                                  ("--input", "-", "--sample", "--seed", "1")])
def test_a_point_model_refuses_token_options(args):
    result = cli("infer", SQUARES, *args, stdin="[[[-1, -1], [-1, 1]]]")
    assert result.returncode == USAGE and "is a point model" in result.stderr, result.stderr
    assert args[0 if args[0] == "--text" else 2] in result.stderr


def test_the_shipped_point_model_still_decodes_its_input(tmp_path):
    np.save(tmp_path / "square.npy", np.array([[[-1, -1], [-1, 1]]], np.float32))
    result = cli("infer", SQUARES, "--input", tmp_path / "square.npy", "--attention")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    np.testing.assert_allclose(doc["outputs"], [[[1, 1], [1, -1]]], atol=0.25)
    assert np.asarray(doc["attention"]).shape == (1, 2, 2)
    assert "Missing option '--input'" in cli("infer", SQUARES).stderr


def test_a_transformer_export_decodes_with_beams_attention_and_plot(transformer_export, tmp_path):
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu")
    texts = ["two is one", "nine is nine four"]
    plot = tmp_path / "attention.png"
    result = cli("infer", transformer_export.path, *(a for t in texts for a in ("--text", t)), "--beam", "3",
                 "--n-best", "2", "--attention", "--plot", plot)
    found = records(result)
    expected = runtime.translate_batch(texts, beam_size=3, num_hypotheses=2, return_attention=True)
    assert_matches(found, expected)
    for record, hyps in zip(found, expected):
        assert record["source_tokens"] == record["source"].split() + ["</s>"]
        attention = np.asarray(record["hypotheses"][0]["attention"])  # last layer's cross-attention, head mean
        assert attention.shape == (len(hyps[0].tokens), len(record["source_tokens"]))
        np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-5)
    assert plot.read_bytes()[:8] == PNG_MAGIC and f"wrote {plot}" in result.stderr


@pytest.mark.parametrize(("args", "code", "fragments"), [
    (("--text", "one", "--max-len", "9"), USAGE, ["--max-len 9 is more than", "max_positions 8",
                                                  "--max-len 8 or less"]),
    (("--text", "one " * 8), BAD_INPUT, ["--text #1: 9 tokens with the closing </s>", "max_positions 8", "split it"]),
])
def test_a_transformer_refuses_what_its_position_table_cannot_hold(transformer_export, args, code, fragments):
    result = cli("infer", transformer_export.path, *args)
    assert result.returncode == code and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_a_narrow_attention_map_keeps_its_whole_axis_label(tmp_path):
    """A map of few source tokens is narrower than its x-axis name: the PNG grows to hold it (it was cut off)."""
    import io

    from matplotlib.figure import Figure
    from PIL import Image

    from runtime.plot import Heatmap, plot_heatmaps

    name = "source token (the order the model read them); * = unknown to the model, read as its unknown token"
    out = io.BytesIO()
    plot_heatmaps([Heatmap(np.eye(3, 2), ["a", "b", "c"], ["x*", "</s>"], "output token", name, "input 0")],
                  "attention", out)
    fig = Figure(dpi=100)
    text = fig.text(0, 0, name, fontsize="small")
    fig.canvas.draw()
    assert Image.open(io.BytesIO(out.getvalue())).width >= text.get_window_extent().width
