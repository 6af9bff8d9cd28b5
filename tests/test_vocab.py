"""Vocabulary: building, text <-> ids, padding, strict storage, hashing, and the optional subword tokenizer."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.errors import Seq2OnnxError
from runtime.vocab import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    Specials,
    TokenizerUnavailableError,
    VocabError,
    Vocabulary,
)

TEXTS = ["one is one", "two is two", "three is three"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def words() -> Vocabulary:
    return Vocabulary.build(TEXTS, "whitespace")


def test_specials_have_fixed_ids(words: Vocabulary) -> None:
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert words.tokens[:4] == SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")
    assert issubclass(VocabError, Seq2OnnxError) and issubclass(VocabError, ValueError)


def test_build_orders_by_frequency_then_token(words: Vocabulary) -> None:
    assert words.tokens[4:] == ("is", "one", "three", "two")  # "is" 3 times; the rest twice, alphabetical
    chars = Vocabulary.build(["abba", "cab"], "char")
    assert chars.tokens[4:] == ("a", "b", "c")  # a: 3, b: 3, c: 1


def test_build_is_deterministic_whatever_the_text_order() -> None:
    assert Vocabulary.build(TEXTS, "whitespace") == Vocabulary.build(TEXTS[::-1], "whitespace")


def test_min_freq_and_max_size() -> None:
    texts = ["a a a b b c"]
    assert Vocabulary.build(texts, "whitespace", min_freq=2).tokens[4:] == ("a", "b")
    assert Vocabulary.build(texts, "whitespace", max_size=5).tokens[4:] == ("a",)  # max_size counts the specials
    assert len(Vocabulary.build(texts, "whitespace", max_size=4)) == 4
    for bad in ({"min_freq": 0}, {"min_freq": 1.5}, {"max_size": 3}, {"max_size": True}):
        with pytest.raises(VocabError):
            Vocabulary.build(texts, "whitespace", **bad)


def test_build_refuses_bad_input() -> None:
    with pytest.raises(VocabError, match="one string"):
        Vocabulary.build("one is one", "whitespace")
    with pytest.raises(VocabError, match=r"texts\[1\] must be a string"):
        Vocabulary.build(["a", 3], "char")
    with pytest.raises(VocabError, match="must be one of"):
        Vocabulary.build(TEXTS, "bytes")
    with pytest.raises(VocabError, match="from_tokenizer"):
        Vocabulary.build(TEXTS, "subword")


@pytest.mark.parametrize("kind, text", [("char", "321 cab"), ("whitespace", "two is one")])
def test_encode_decode_round_trip(kind: str, text: str) -> None:
    vocab = Vocabulary.build([text, "abc 123"], kind)
    ids = vocab.encode(text, add_bos=True)
    assert ids[0] == BOS and ids[-1] == EOS and UNK not in ids
    assert vocab.decode(ids) == text
    assert vocab.encode(text, add_eos=False) == ids[1:-1]


def test_unknown_tokens_and_written_specials_become_unk(words: Vocabulary) -> None:
    assert words.encode("one is four") == [words.tokens.index("one"), words.tokens.index("is"), UNK, EOS]
    assert words.encode("<s> </s> <pad> <unk>", add_eos=False) == [UNK] * 4  # text never yields control ids
    assert words.decode(words.encode("one is four")) == "one is <unk>"  # decode shows what was not known


def test_unknown_tokens_names_what_encode_reads_as_unk(words: Vocabulary) -> None:
    """A service had no way to tell that a text's tokens were read as <unk> (infer's note aside; found by a fresh
    walk): unknown_tokens names them, in order, as infer's note does."""
    assert words.unknown_tokens("one is four or <s>") == ["four", "or", "<s>"]
    assert words.unknown_tokens("one is one") == []
    chars = Vocabulary.build(["3/3/15"], "char")
    assert chars.unknown_tokens("3 \u2603/\u65e5") == [" ", "\u2603", "\u65e5"]
    no_unk = Vocabulary(("SOS", "EOS", "one"), "whitespace", specials=Specials(bos=0, eos=1))
    assert no_unk.unknown_tokens("one one") == []  # none: encode refuses an unknown token by name
    with pytest.raises(VocabError, match="'two' is not in the vocabulary"):
        no_unk.unknown_tokens("one two")


def test_decode_stops_at_eos_and_skips_control_ids(words: Vocabulary) -> None:
    one, two = words.tokens.index("one"), words.tokens.index("two")
    assert words.decode([BOS, one, PAD, UNK, two, EOS, one, one]) == "one <unk> two"
    assert words.decode(np.array([one, EOS], dtype=np.int64)) == "one"
    assert words.decode([]) == ""


@pytest.mark.parametrize(("ids", "says"), [
    ([99], r"ids\[0\] must be an int in \[0, \d+\), got 99"), ([-1], r"ids\[0\] .* got -1"), ([1.0], r"ids\[0\] .* got 1.0"),
    ([True], r"ids\[0\] .* got True"), ([4, True], r"ids\[1\] .* got True"), ([4, 1.5], r"ids\[1\] .* got 1.5"),
    ([4, "5"], r"ids\[1\] .* got '5'"), ([5, 2**70], r"ids\[1\] .* got 1180591620717411303424"),
    ([np.int64(5), 99], r"ids\[1\] .* got 99"), ([[4, 5]], "one sequence"), ([[4, 5], [6]], "one sequence"),
    (5, "a sequence of ints, got 5"), (None, "a sequence of ints, got None"), (np.array([[4, 5]]), r"shape \(1, 2\)"),
    (np.array([4.0]), r"ids\[0\] .* got 4.0"), (np.array([True]), r"ids\[0\] .* got True"),
])
def test_decode_refuses_bad_ids_by_position(words: Vocabulary, ids: Any, says: str) -> None:
    with pytest.raises(VocabError, match=says):
        words.decode(ids)
    if isinstance(ids, list):  # a list of plain ints takes a path of its own: a tuple gets the same refusal
        with pytest.raises(VocabError, match=says):
            words.decode(tuple(ids))


def test_a_list_of_ints_decodes_as_the_same_ids_in_an_array(words: Vocabulary) -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(0, len(words.tokens), rng.integers(0, 12)).astype(np.int64)
        assert words.decode(ids.tolist()) == words.decode(ids) == words.decode(tuple(ids.tolist()))
    assert words.decode([np.int64(words.tokens.index("one")), EOS]) == "one"  # numpy ints: the general path


def test_encode_batch_pads_and_reports_lengths(words: Vocabulary) -> None:
    ids, lengths = words.encode_batch(["one", "two is two", ""], add_bos=True)
    assert ids.dtype == np.int64 and lengths.dtype == np.int64
    assert ids.shape == (3, 5) and lengths.tolist() == [3, 5, 2]
    for row, n, text in zip(ids, lengths, ["one", "two is two", ""]):
        assert row[:n].tolist() == words.encode(text, add_bos=True)
        assert (row[n:] == PAD).all()
    empty, no_lengths = words.encode_batch([])
    assert empty.shape == (0, 0) and no_lengths.shape == (0,)
    with pytest.raises(VocabError, match="one string"):
        words.encode_batch("one")


def test_a_batch_pads_to_its_longest_row_or_a_wider_width(words: Vocabulary) -> None:
    ids, lengths = words.encode_batch(["two is two", "one"], add_bos=True, reverse=True, width=7)
    first = [BOS, *words.encode("two is two", add_eos=False)[::-1], EOS]
    assert ids.tolist() == [first + [PAD] * 2, [BOS, words.tokens.index("one"), EOS] + [PAD] * 4]
    assert lengths.tolist() == [5, 3] and ids.dtype == lengths.dtype == np.int64
    assert words.encode_batch(["two is two"], width=2)[0].shape == (1, 4)  # never narrower than a row
    assert words.encode_batch([], width=3)[0].shape == (0, 3)
    assert words.encode_batch(["one", "two"], add_eos=False)[0].shape == (2, 1)
    for width in (-1, 1.5, None, "3", True):
        with pytest.raises(VocabError, match=r"width must be an int >= 0"):
            words.encode_batch(["one"], width=width)
    with pytest.raises(VocabError, match="texts must be a list of strings, got None"):
        words.encode_batch(None)


@pytest.mark.parametrize("tokens, kind, match", [
    (("a", "b"), "char", "start with the specials"),
    (SPECIAL_TOKENS + ("a", "a"), "char", "unique"),
    (SPECIAL_TOKENS + ("<s>",), "whitespace", "unique"),
    (SPECIAL_TOKENS + ("ab",), "char", "single characters"),
    (SPECIAL_TOKENS + ("a b",), "whitespace", "without whitespace"),
    (SPECIAL_TOKENS + ("",), "whitespace", "non-empty"),
    (SPECIAL_TOKENS, "bpe", "must be one of"),
])
def test_constructor_refuses_malformed_vocabularies(tokens: tuple, kind: str, match: str) -> None:
    with pytest.raises(VocabError, match=match):
        Vocabulary(tokens, kind)


def test_dict_round_trip_and_strict_keys(words: Vocabulary) -> None:
    data = words.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert Vocabulary.from_dict(data) == words
    with pytest.raises(VocabError, match=r"unknown \['extra'\]"):
        Vocabulary.from_dict({**data, "extra": 1})
    with pytest.raises(VocabError, match=r"missing \['tokens'\]"):
        Vocabulary.from_dict({k: v for k, v in data.items() if k != "tokens"})
    with pytest.raises(VocabError, match=r"unknown \['tokenizer_json'\]"):
        Vocabulary.from_dict({**data, "tokenizer_json": "{}"})
    with pytest.raises(VocabError, match="99 is not understood; this seq2onnx reads versions"):
        Vocabulary.from_dict({**data, "format_version": 99})
    for version in (1.0, "1", True):  # another type is named as such, not "not understood"
        with pytest.raises(VocabError, match=f"format_version must be an integer, got {type(version).__name__} "):
            Vocabulary.from_dict({**data, "format_version": version})
    with pytest.raises(VocabError, match="JSON object"):
        Vocabulary.from_dict([data])


def test_save_load(words: Vocabulary, tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    words.save(path)
    text = path.read_text(encoding="utf-8")
    assert text == json.dumps(words.to_dict(), indent=2, sort_keys=True) + "\n"
    assert Vocabulary.load(path) == words
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]  # no temporary file left behind


@pytest.mark.parametrize("content, match", [
    (b"{not json", "not valid JSON"), (b"\xff\xfe", r"not UTF-8 \(byte 0xff at offset 0 of the file\)"),
    (b'{"tokens": []}', "missing"),
])
def test_load_refuses_bad_files(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_bytes(content)
    with pytest.raises(VocabError, match=match):
        Vocabulary.load(path)
    with pytest.raises(VocabError, match="does not exist"):
        Vocabulary.load(tmp_path / "missing.json")


def test_sha256_is_stable_across_processes_and_follows_content(words: Vocabulary) -> None:
    code = ("import sys; from runtime.vocab import Vocabulary; "
            f"vocab = Vocabulary.build({TEXTS!r}, 'whitespace'); vocab.decode(vocab.encode('one is one')); "
            "print(vocab.sha256, [m for m in ('torch', 'tokenizers', 'training') if m in sys.modules])")
    other = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""})  # another hash seed: sets are not in it
    assert other.stdout.split(maxsplit=1) == [words.sha256, "[]\n"]  # and the runtime side imported no torch
    assert len(words.sha256) == 64
    assert Vocabulary.build(TEXTS + ["four"], "whitespace").sha256 != words.sha256
    assert Vocabulary.build(TEXTS, "char").sha256 != words.sha256


def test_subword_without_tokenizers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(TokenizerUnavailableError, match=r"pip install -e '\.\[text\]'"):
        Vocabulary.from_tokenizer_json("{}")
    vocab = Vocabulary(SPECIAL_TOKENS + ("a",), "subword", "{}")  # known sizes need no import ...
    assert len(vocab) == 5
    with pytest.raises(ImportError):  # ... encoding does
        vocab.encode("a")


# -- subword, with a tokenizer trained here when the `tokenizers` package is installed ------------------------------


def _trained_tokenizer(specials: list[str]) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=specials)
    tokenizer.train_from_iterator(TEXTS, trainer)
    return tokenizer.to_str()


def test_subword_round_trip_and_storage(tmp_path: Path) -> None:
    text = _trained_tokenizer(list(SPECIAL_TOKENS))
    file = tmp_path / "tokenizer.json"
    file.write_text(text, encoding="utf-8")
    vocab = Vocabulary.from_tokenizer_file(file)
    assert vocab.tokenizer == "subword" and vocab.tokens[:4] == SPECIAL_TOKENS
    assert set(vocab.tokens[4:]) == {"one", "two", "three", "is"}
    ids = vocab.encode("two is three", add_bos=True)
    assert ids[0] == BOS and ids[-1] == EOS and UNK not in ids
    assert vocab.tokenize("two is three") == ["two", "is", "three"]
    assert vocab.decode(ids) == "two is three"
    assert vocab.encode("one is <s> five", add_eos=False)[2:] == [UNK, UNK]
    batch, lengths = vocab.encode_batch(["one", "two is two"])
    assert batch.tolist() == [vocab.encode("one") + [PAD, PAD], vocab.encode("two is two")]
    assert lengths.tolist() == [2, 4]
    vocab.save(tmp_path / "vocab.json")  # one file holds the tokenizer too
    again = Vocabulary.load(tmp_path / "vocab.json")
    assert again == vocab and again.sha256 == vocab.sha256 and again.encode("two is three") == ids[1:]


def test_subword_text_a_tokenizer_leaves_out_reads_as_unknown() -> None:
    """A BPE saved without an unk_token leaves out characters it has no token for, without a word: 'ééé' read as no
    tokens at all, so such pairs trained and evaluated as empty ones (an untrained model 'matched' them by ending
    at once) and infer said nothing (found by a fresh walk). Each run of such text now reads as the unknown id."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())  # no unk_token
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(TEXTS * 5, tokenizers.trainers.BpeTrainer(special_tokens=list(SPECIAL_TOKENS)))
    vocab = Vocabulary.from_tokenizer_json(tokenizer.to_str())
    assert tokenizer.encode("ééé").ids == []  # the library's own behaviour, which this guards against
    assert vocab.encode("ééé") == [UNK, EOS]
    assert vocab.tokenize("two ééé three") == ["two", "ééé", "three"]
    assert vocab.encode("two ééé three", add_eos=False) == [vocab.encode("two", add_eos=False)[0], UNK,
                                                             vocab.encode("three", add_eos=False)[0]]
    assert vocab.tokenize("twoé") == ["two", "é"] and vocab.encode("twoé", add_eos=False)[-1] == UNK
    assert vocab.encode("two three") == vocab.encode("two  three") and UNK not in vocab.encode("two three")


def test_a_token_read_as_the_tokenizers_own_unknown_one_is_shown_as_its_text() -> None:
    """infer's note of unknown tokens said ('<unk>') for a tokenizer with an unk_token, where one without said ('z')
    (found by a fresh walk): the text a token stood for is what the user can check."""
    vocab = Vocabulary.from_tokenizer_json(_trained_tokenizer(list(SPECIAL_TOKENS)))
    assert vocab.tokenize("two is five") == ["two", "is", "five"]
    assert vocab.encode("two is five", add_eos=False)[2] == UNK


def test_subword_refuses_tokenizers_without_the_specials() -> None:
    with pytest.raises(VocabError, match="at ids 0..3"):
        Vocabulary.from_tokenizer_json(_trained_tokenizer(["[PAD]", "[UNK]"]))
    with pytest.raises(VocabError, match="not a tokenizers file"):
        Vocabulary.from_tokenizer_json("{not a tokenizer")
    # valid JSON of another kind read as the package's parse error "expected `,` or `}` at line 1 column 5"
    with pytest.raises(VocabError, match=r"is JSON, but not a tokenizers file \(it has no 'model': its keys are "
                                         r"\['x'\]\)"):
        Vocabulary.from_tokenizer_json('{"x": 1}')


def test_subword_tokens_must_match_the_tokenizer() -> None:
    vocab = Vocabulary.from_tokenizer_json(_trained_tokenizer(list(SPECIAL_TOKENS)))
    forged = Vocabulary.from_dict({**vocab.to_dict(), "tokens": list(SPECIAL_TOKENS) + ["x"]})
    with pytest.raises(VocabError, match="do not match"):
        forged.encode("one")


def test_saved_vocabulary_has_the_umask_permissions_like_other_files(tmp_path):
    import os
    import stat

    vocab = Vocabulary.build(["a b"], "whitespace")
    vocab.save(tmp_path / "v.json")
    (tmp_path / "other.json").write_text("{}")
    assert stat.S_IMODE(os.stat(tmp_path / "v.json").st_mode) == stat.S_IMODE(os.stat(tmp_path / "other.json").st_mode)
