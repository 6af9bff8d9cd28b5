"""Text data: the built-in seeded sets keep their promises; user TSV / parallel files are read by the stated rules."""
from __future__ import annotations

import json
from datetime import date, datetime
from pathlib import Path

import pytest

from runtime.vocab import UNK, Vocabulary
from training.data import DataError
from training.tokens.builtin import (
    BUILTIN_LOADERS,
    DATE_FORMATS,
    DATES,
    DATES_MAX_YEAR,
    DATES_MIN_YEAR,
    LOOKUP,
    LOOKUP_DIGITS,
    REVERSE,
    REVERSE_MAX_LEN,
    REVERSE_MIN_LEN,
    TOKENIZER_OF,
    TOY_TRANSLATION,
    generate_dates,
    generate_lookup,
    generate_reverse,
)
from training.tokens.data import describe_text_dataset, load_parallel, load_text_dataset, load_tsv, reload_text_dataset
from training.tokens.pairs import MAX_BAD_SHOWN, MAX_LINE_CHARS, TextPairs

SIZES = {REVERSE: (10_000, 1_000), TOY_TRANSLATION: (9, 9), LOOKUP: (5_000, 1_000), DATES: (10_000, 1_000)}
# An independent reading of each date style, by the standard library (C locale: English names).
STRPTIME_FORMATS = ("%A, %B %d %Y", "%m/%d/%y", "%d %b %Y", "%B %d, %Y", "%Y.%m.%d", "%d %B %Y", "%a %d %b %Y",
                    "%m/%d/%Y", "%Y%m%d", "%A %d %B %Y")
WEEKDAY_ABBREVIATIONS = {"mon", "tue", "wed", "thu", "fri", "sat", "sun"}  # no month name starts like these


@pytest.fixture(scope="module")
def builtins() -> dict[str, tuple[TextPairs, TextPairs]]:
    return {name: load_text_dataset(name) for name in BUILTIN_LOADERS}


def test_builtin_sizes_and_determinism(builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    assert set(builtins) == set(SIZES)
    for name, (train, test) in builtins.items():
        assert (len(train), len(test)) == SIZES[name], name
        assert load_text_dataset(name) == (train, test), name  # the same seed gives the same pairs
    for generate in (generate_reverse, generate_lookup, generate_dates):
        assert generate(50, 1) == generate(50, 1) and generate(50, 1) != generate(50, 2)


def test_reverse_targets_are_reversed_sources(builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    for pairs in builtins[REVERSE]:
        assert all(t == s[::-1] for s, t in zip(pairs.sources, pairs.targets))
        assert all(s.isdigit() and s.isascii() for s in pairs.sources)
        assert {len(s) for s in pairs.sources} == set(range(REVERSE_MIN_LEN, REVERSE_MAX_LEN + 1))


def test_toy_translation_is_the_nine_notebook_pairs(builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    train, test = builtins[TOY_TRANSLATION]
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert list(zip(train.sources, train.targets)) == [(f"{w} is {w}", f"{i} la {i}") for i, w in enumerate(words, 1)]
    assert test == train


def test_lookup_answer_is_the_digit_at_the_zero_based_position(
        builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    positions = set()
    for pairs in builtins[LOOKUP]:
        for source, target in zip(pairs.sources, pairs.targets):
            *digits, query, position = source.split()
            assert len(digits) == LOOKUP_DIGITS and all(len(d) == 1 and d.isdigit() for d in digits)
            assert query == "?"
            assert target == digits[int(position)]
            positions.add(int(position))
    assert positions == set(range(LOOKUP_DIGITS))  # 0-based: 0 occurs, 10 never


def test_dates_denote_their_iso_target(builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    used, named = set(), 0
    for pairs in builtins[DATES]:
        for source, target in zip(pairs.sources, pairs.targets):
            day = date.fromisoformat(target)
            readings = {}
            for fmt in STRPTIME_FORMATS:
                try:
                    readings[fmt] = datetime.strptime(source, fmt).date()
                except ValueError:
                    pass
            assert set(readings.values()) == {day}, source  # readable, and by one date only
            used.update(readings)
            assert DATES_MIN_YEAR <= day.year <= DATES_MAX_YEAR
            first = source.split()[0].rstrip(",")
            if first[:3] in WEEKDAY_ABBREVIATIONS:  # strptime ignores weekdays, so check them here
                assert first in (day.strftime("%A").lower(), day.strftime("%a").lower()), source
                named += 1
    assert len(used) == len(DATE_FORMATS) == len(STRPTIME_FORMATS) >= 8  # every style occurs
    assert named > 1_000  # three of the ten styles name the weekday


def test_each_builtin_fits_its_tokenizer(builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    for name, (train, test) in builtins.items():
        vocab = Vocabulary.build(train.sources + train.targets, TOKENIZER_OF[name])
        for text in test.sources[:200] + test.targets[:200]:
            ids = vocab.encode(text)
            assert UNK not in ids and vocab.decode(ids) == text, (name, text)


@pytest.mark.parametrize("sources, targets, match", [
    (["a"], ["b", "c"], "as many"),
    ([], [], "no pairs"),
    ("ab", "ba", "list of strings"),
    (["a", ""], ["b", "c"], "pair 1 source is empty"),
    (["a\tb"], ["c"], "tab or line break"),
    (["a"], [3], "pair 0 target is of type int"),
    (["a" * (MAX_LINE_CHARS + 1)], ["b"], "over the limit"),
])
def test_text_pairs_validation(sources: list, targets: list, match: str) -> None:
    with pytest.raises(DataError, match=match):
        TextPairs(sources, targets, "mine")


# -- user files ----------------------------------------------------------------------------------------------------


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_tsv_reads_pairs_and_skips_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "d.tsv", "\ufeffhello\tbonjour\r\n\n   \n cat \t chat \nlast\tdernier")
    pairs = load_tsv(path)
    assert pairs.sources == ("hello", "cat", "last") and pairs.targets == ("bonjour", "chat", "dernier")


def test_tsv_lists_every_bad_line_by_number(tmp_path: Path) -> None:
    lines = ["ok\tfine", "no tab here", "a\tb\tc", "\tempty source", "ok\tfine", "empty target\t ",
             "x\t" + "y" * MAX_LINE_CHARS]
    with pytest.raises(DataError) as err:
        load_tsv(write(tmp_path / "d.tsv", "\n".join(lines) + "\n"))
    message = str(err.value)
    assert "5 bad entries" in message
    for fragment in ("line 2 has 0 tabs", "line 3 has 2 tabs", "line 4: source is empty",
                     "line 6: target is empty", f"line 7 has {MAX_LINE_CHARS + 2} characters"):
        assert fragment in message
    assert "line 1" not in message and "line 5" not in message


def test_tsv_shows_the_first_bad_lines_and_counts_the_rest(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        load_tsv(write(tmp_path / "d.tsv", "no tab\n" * 12))
    message = str(err.value)
    assert "12 bad entries" in message and f"and {12 - MAX_BAD_SHOWN} more" in message
    assert f"line {MAX_BAD_SHOWN} " in message and f"line {MAX_BAD_SHOWN + 1} " not in message


def test_tsv_refuses_non_utf8_with_line_and_byte(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"line 2 is not UTF-8 \(byte 0xe9 at offset 2\)"):
        load_tsv(write(tmp_path / "d.tsv", b"a\tb\r\nd\t\xe9t\xe9\n"))


@pytest.mark.parametrize("content, match", [("", "holds no pairs"), ("\n \n", "holds no pairs")])
def test_tsv_without_pairs(tmp_path: Path, content: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_tsv(write(tmp_path / "d.tsv", content))


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="missing.tsv' does not exist"):
        load_tsv(tmp_path / "missing.tsv")
    with pytest.raises(DataError, match="nope.txt' does not exist"):
        load_parallel(write(tmp_path / "src.txt", "a\n"), tmp_path / "nope.txt")


def test_parallel_reads_aligned_lines(tmp_path: Path) -> None:
    src = write(tmp_path / "src.txt", "hello\n\nthe cat \n")
    tgt = write(tmp_path / "tgt.txt", "bonjour\n\nle chat\n")
    assert load_parallel(src, tgt) == TextPairs(["hello", "the cat"], ["bonjour", "le chat"], f"{src},{tgt}")


def test_parallel_files_may_end_in_different_numbers_of_blank_lines(tmp_path: Path) -> None:
    src = write(tmp_path / "src.txt", "hello\nthe cat\n")
    tgt = write(tmp_path / "tgt.txt", "bonjour\nle chat\n\n  \n\n")
    assert load_parallel(src, tgt) == TextPairs(["hello", "the cat"], ["bonjour", "le chat"], f"{src},{tgt}")


def test_parallel_refuses_mismatched_counts(tmp_path: Path) -> None:
    src = write(tmp_path / "src.txt", "a\nb\nc\n")
    tgt = write(tmp_path / "tgt.txt", "x\ny\n")
    with pytest.raises(DataError, match=r"same number of lines; .*src.txt has 3, .*tgt.txt has 2"):
        load_parallel(src, tgt)


def test_parallel_lists_bad_lines_with_their_file(tmp_path: Path) -> None:
    src = write(tmp_path / "src.txt", b"a\n\nc\td\ne\nok\n")
    tgt = write(tmp_path / "tgt.txt", b"x\ny\nz\n\xff\nok\n")
    with pytest.raises(DataError) as err:
        load_parallel(src, tgt)
    message = str(err.value)
    assert "3 bad entries" in message
    assert "line 2: source is empty" in message  # blank on one side only
    assert "line 3: source contains a tab" in message
    assert "line 4 of tgt.txt is not UTF-8 (byte 0xff at offset 0)" in message


def test_a_utf16_file_and_lone_carriage_returns_are_named_as_such(tmp_path: Path) -> None:
    """A UTF-16 TSV read as 'line 1 is not UTF-8 ...; line 21 has 0 tabs', and one of \\r-only line ends as 'line 1
    has 20 tabs, expected exactly 1' (found by a fresh walk)."""
    utf16 = write(tmp_path / "u16.tsv", "a\tb\nc\td\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"u16.tsv: is UTF-16 \(it starts with UTF-16's byte-order mark\), not UTF-8"):
        load_tsv(utf16)
    mac = write(tmp_path / "cr.tsv", b"a\tb\rc\td\r")
    with pytest.raises(DataError) as err:
        load_tsv(mac)
    assert "1 bad entry" in str(err.value) and "line 1, character 3: a carriage return (\\r) that ends no line" \
        in str(err.value) and "tabs" not in str(err.value), str(err.value)
    bomless = write(tmp_path / "le.tsv", "a\tb\nc\td\n".encode("utf-16-le"))  # read as 'line 2 has 0 tabs'
    with pytest.raises(DataError, match=r"line 1, character 1: a NUL byte: UTF-16 text without its byte-order mark"):
        load_tsv(bomless)
    source, target = write(tmp_path / "src.txt", b"a\rc\r"), write(tmp_path / "tgt.txt", b"b\nd\n")
    with pytest.raises(DataError, match=r"line 1 of src.txt, character 1: a carriage return"):  # not the line counts
        load_parallel(source, target)


def test_load_text_dataset_splits_user_files_deterministically(tmp_path: Path) -> None:
    lines = [f"s{i}\tt{i}" for i in range(10)]
    tsv = write(tmp_path / "d.tsv", "\n".join(lines))
    train, test = load_text_dataset(tsv)
    assert (len(train), len(test)) == (8, 2)
    assert sorted(train.sources + test.sources) == sorted(f"s{i}" for i in range(10))
    assert load_text_dataset(str(tsv)) == (train, test)
    src = write(tmp_path / "src.txt", "\n".join(f"s{i}" for i in range(10)))
    tgt = write(tmp_path / "tgt.txt", "\n".join(f"t{i}" for i in range(10)))
    by_string, by_tuple = load_text_dataset(f"{src},{tgt}"), load_text_dataset((src, tgt))
    assert by_string == by_tuple
    assert by_string[1].sources == test.sources and by_string[1].targets == test.targets
    with pytest.raises(DataError, match="neither a built-in data set"):
        load_text_dataset("squares")
    with pytest.raises(DataError, match="at least 2"):
        load_text_dataset(write(tmp_path / "one.tsv", "a\tb\n"))


def test_descriptions_are_json_and_reload(tmp_path: Path, builtins: dict[str, tuple[TextPairs, TextPairs]]) -> None:
    for name, (train, test) in builtins.items():
        description = json.loads(json.dumps(describe_text_dataset(name, train, test)))
        assert description["name"] == name and description["tokenizer"] == TOKENIZER_OF[name]
        assert (description["n_train"], description["n_test"]) == SIZES[name]
    assert describe_text_dataset(REVERSE, *builtins[REVERSE])["train_seed"] == 101
    tsv = write(tmp_path / "d.tsv", "".join(f"s{i}\tt{i}\n" for i in range(5)))
    src, tgt = write(tmp_path / "src.txt", "a\nb\n"), write(tmp_path / "tgt.txt", "x\ny\n")
    for source in (tsv, f"{src},{tgt}", DATES):
        description = json.loads(json.dumps(describe_text_dataset(source, *load_text_dataset(source))))
        assert reload_text_dataset(description) == load_text_dataset(source)
    description = describe_text_dataset(tsv, *load_text_dataset(tsv))
    assert description["name"] == "tsv" and len(description["sha256"]) == 64
    write(tsv, "".join(f"s{i}\tt{i}\n" for i in range(6)))
    with pytest.raises(DataError, match="changed since the run started"):
        reload_text_dataset(description)
