"""Text pairs for token models: seeded built-in data sets and user TSV / parallel files (numpy + stdlib)."""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from runtime.manifest import sha256_file
from training.data import HOLDOUT_FRACTION, SPLIT_SEED, DataError, reload_unchanged

MAX_LINE_CHARS = 1000  # per file line (TSV: both sides and the tab), and per source or target
MAX_TEXT_FILE_BYTES = 1 << 30  # 1 GiB: files are read whole
MAX_BAD_SHOWN = 5  # bad lines quoted in one error; the rest are counted
FORBIDDEN_CHARS = ("\t", "\n", "\r")  # a pair must fit on one TSV line
UTF8_BOM = b"\xef\xbb\xbf"
DIGITS = "0123456789"

REVERSE = "reverse"  # digit strings -> the same digits reversed (character tokens)
REVERSE_MIN_LEN, REVERSE_MAX_LEN = 3, 12
REVERSE_TRAIN_SIZE, REVERSE_TRAIN_SEED = 10_000, 101
REVERSE_TEST_SIZE, REVERSE_TEST_SEED = 1_000, 102

TOY_TRANSLATION = "toy-translation"  # the nine pairs of the attention notebook; train = test = all nine
TOY_SOURCES = ("one is one", "two is two", "three is three", "four is four", "five is five",
               "six is six", "seven is seven", "eight is eight", "nine is nine")
TOY_TARGETS = ("1 la 1", "2 la 2", "3 la 3", "4 la 4", "5 la 5", "6 la 6", "7 la 7", "8 la 8", "9 la 9")

LOOKUP = "lookup"  # "3 1 4 1 5 9 2 6 5 3 ? 4" -> "5": the digit at a 0-based position (whitespace tokens)
LOOKUP_DIGITS = 10
LOOKUP_QUERY = "?"
LOOKUP_TRAIN_SIZE, LOOKUP_TRAIN_SEED = 5_000, 201
LOOKUP_TEST_SIZE, LOOKUP_TEST_SEED = 1_000, 202

DATES = "dates"  # human-written dates -> ISO "2015-03-03" (character tokens)
DATES_MIN_YEAR, DATES_MAX_YEAR = 1970, 2049  # inclusive; two-digit years: 70-99 -> 19yy, 00-49 -> 20yy
DATES_TRAIN_SIZE, DATES_TRAIN_SEED = 10_000, 301
DATES_TEST_SIZE, DATES_TEST_SEED = 1_000, 302
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")  # date.weekday() order
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
# Slashes always mean month/day (US order), so no source is ambiguous. English names, independent of the locale.
DATE_FORMATS = (
    "{weekday}, {month} {day} {year}",  # tuesday, march 3 2015
    "{m}/{day}/{yy}",  # 3/3/15
    "{dd} {mon} {year}",  # 03 mar 2015
    "{month} {day}, {year}",  # march 3, 2015
    "{year}.{mm}.{dd}",  # 2015.03.03
    "{day} {month} {year}",  # 3 march 2015
    "{wkd} {dd} {mon} {year}",  # tue 03 mar 2015
    "{mm}/{dd}/{year}",  # 03/03/2015
    "{year}{mm}{dd}",  # 20150303
    "{weekday} {day} {month} {year}",  # tuesday 3 march 2015
)

TSV, PARALLEL = "tsv", "parallel"
TSV_SUFFIX = ".tsv"
PAIR_SEPARATOR = ","  # "SRC_PATH,TGT_PATH" names two line-aligned files


def _text_problem(text: Any) -> str | None:
    """Why one source or target cannot be used, or None."""
    if not isinstance(text, str):
        return f"is of type {type(text).__name__}, not a string"
    if not text.strip():
        return "is empty"
    if any(c in text for c in FORBIDDEN_CHARS):
        return "contains a tab or line break"
    if len(text) > MAX_LINE_CHARS:
        return f"has {len(text)} characters, over the limit of {MAX_LINE_CHARS}"
    return None


def _listing(origin: str, problems: list[str], expected: str) -> str:
    """One message for every problem: the first MAX_BAD_SHOWN quoted, the rest counted."""
    shown = "; ".join(problems[:MAX_BAD_SHOWN])
    more = f"; and {len(problems) - MAX_BAD_SHOWN} more" if len(problems) > MAX_BAD_SHOWN else ""
    return f"{origin}: {len(problems)} bad {'entry' if len(problems) == 1 else 'entries'} ({expected}): {shown}{more}"


@dataclass(frozen=True)
class TextPairs:
    """Aligned source and target texts: non-empty strings, one line each, as many targets as sources."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    origin: str = "<pairs>"

    def __post_init__(self) -> None:
        for side in ("sources", "targets"):
            value = getattr(self, side)
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise DataError(f"{self.origin}: {side!r} must be a list of strings, got {type(value).__name__}")
            object.__setattr__(self, side, tuple(value))
        if len(self.sources) != len(self.targets):
            raise DataError(f"{self.origin}: 'sources' and 'targets' must be as many; got {len(self.sources)} "
                            f"and {len(self.targets)}; give one target per source")
        if not self.sources:
            raise DataError(f"{self.origin}: holds no pairs; at least one source/target pair is needed")
        problems = [f"pair {i} {side} {why}" for i, pair in enumerate(zip(self.sources, self.targets))
                    for side, text in zip(("source", "target"), pair) if (why := _text_problem(text))]
        if problems:
            raise DataError(_listing(self.origin, problems, f"non-empty strings of at most {MAX_LINE_CHARS} "
                                                            "characters, without tabs or line breaks"))

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, index: Sequence[int] | np.ndarray) -> TextPairs:
        """The pairs at `index`, in that order."""
        return TextPairs([self.sources[i] for i in index], [self.targets[i] for i in index], self.origin)


# -- built-in data sets ------------------------------------------------------------------------------------------


def generate_reverse(n: int, seed: int) -> TextPairs:
    """n random digit strings of REVERSE_MIN_LEN..REVERSE_MAX_LEN digits -> the same digits reversed."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(REVERSE_MIN_LEN, REVERSE_MAX_LEN + 1, size=n)  # (n,)
    digits = np.array(list(DIGITS))[rng.integers(10, size=(n, REVERSE_MAX_LEN))]  # (n, REVERSE_MAX_LEN)
    sources = ["".join(row[:k]) for row, k in zip(digits, lengths)]
    return TextPairs(sources, [s[::-1] for s in sources], f"{REVERSE}/seed={seed}")


def generate_lookup(n: int, seed: int) -> TextPairs:
    """n queries "d0 d1 ... d9 ? p" -> the digit at 0-based position p."""
    rng = np.random.default_rng(seed)
    digits = rng.integers(10, size=(n, LOOKUP_DIGITS))  # (n, LOOKUP_DIGITS)
    positions = rng.integers(LOOKUP_DIGITS, size=n)  # (n,)
    sources = [" ".join(map(str, row)) + f" {LOOKUP_QUERY} {p}" for row, p in zip(digits.tolist(), positions)]
    targets = [str(row[p]) for row, p in zip(digits.tolist(), positions)]
    return TextPairs(sources, targets, f"{LOOKUP}/seed={seed}")


def format_date(day: date, template: str) -> str:
    """One of DATE_FORMATS filled in for `day`, in lower-case English."""
    weekday, month = WEEKDAYS[day.weekday()], MONTHS[day.month - 1]
    return template.format(weekday=weekday, wkd=weekday[:3], month=month, mon=month[:3], day=day.day,
                           dd=f"{day.day:02d}", m=day.month, mm=f"{day.month:02d}", year=day.year,
                           yy=f"{day.year % 100:02d}")


def generate_dates(n: int, seed: int) -> TextPairs:
    """n days uniform over DATES_MIN_YEAR..DATES_MAX_YEAR, each in a random DATE_FORMATS style -> ISO date."""
    rng = np.random.default_rng(seed)
    first, last = date(DATES_MIN_YEAR, 1, 1).toordinal(), date(DATES_MAX_YEAR, 12, 31).toordinal()
    days = [date.fromordinal(d) for d in rng.integers(first, last + 1, size=n).tolist()]
    styles = rng.integers(len(DATE_FORMATS), size=n).tolist()
    sources = [format_date(d, DATE_FORMATS[s]) for d, s in zip(days, styles)]
    return TextPairs(sources, [d.isoformat() for d in days], f"{DATES}/seed={seed}")


def _seeded(generate: Callable[[int, int], TextPairs], train: tuple[int, int],
            test: tuple[int, int]) -> Callable[[], tuple[TextPairs, TextPairs]]:
    return lambda: (generate(*train), generate(*test))


def toy_translation() -> tuple[TextPairs, TextPairs]:
    """The nine notebook pairs; too few to hold any out, so the test set is the training set."""
    pairs = TextPairs(TOY_SOURCES, TOY_TARGETS, TOY_TRANSLATION)
    return pairs, pairs


BUILTIN_LOADERS: dict[str, Callable[[], tuple[TextPairs, TextPairs]]] = {
    REVERSE: _seeded(generate_reverse, (REVERSE_TRAIN_SIZE, REVERSE_TRAIN_SEED),
                     (REVERSE_TEST_SIZE, REVERSE_TEST_SEED)),
    TOY_TRANSLATION: toy_translation,
    LOOKUP: _seeded(generate_lookup, (LOOKUP_TRAIN_SIZE, LOOKUP_TRAIN_SEED), (LOOKUP_TEST_SIZE, LOOKUP_TEST_SEED)),
    DATES: _seeded(generate_dates, (DATES_TRAIN_SIZE, DATES_TRAIN_SEED), (DATES_TEST_SIZE, DATES_TEST_SEED)),
}
# What describe_text_dataset records for each built-in, besides the sizes; "tokenizer" is the Vocabulary kind.
BUILTIN_PARAMS: dict[str, dict[str, Any]] = {
    REVERSE: {"tokenizer": "char", "min_len": REVERSE_MIN_LEN, "max_len": REVERSE_MAX_LEN,
              "train_seed": REVERSE_TRAIN_SEED, "test_seed": REVERSE_TEST_SEED},
    TOY_TRANSLATION: {"tokenizer": "whitespace", "test_is_train": True},
    LOOKUP: {"tokenizer": "whitespace", "digits": LOOKUP_DIGITS, "positions": "0-based",
             "train_seed": LOOKUP_TRAIN_SEED, "test_seed": LOOKUP_TEST_SEED},
    DATES: {"tokenizer": "char", "min_year": DATES_MIN_YEAR, "max_year": DATES_MAX_YEAR,
            "formats": list(DATE_FORMATS), "train_seed": DATES_TRAIN_SEED, "test_seed": DATES_TEST_SEED},
}
TOKENIZER_OF = {name: params["tokenizer"] for name, params in BUILTIN_PARAMS.items()}
# Held-out exact-sequence accuracy each built-in set should reach (greedy); training and eval print them beside
# what was measured.
ACCURACY_TARGETS = {REVERSE: 0.99, TOY_TRANSLATION: 1.0, DATES: 0.99, LOOKUP: 0.95}
MAX_LEN_MARGIN = 5  # evaluation decodes this many steps past the longest reference target (EOS included)


# -- user files --------------------------------------------------------------------------------------------------

Lines = list[tuple[int, str | None]]  # (1-based line number, text, or None when the line is bad)


def _read_lines(path: Path, name_file: bool = False) -> tuple[Lines, list[tuple[int, str]]]:
    """Every line of a UTF-8 file (CRLF and a leading BOM accepted), and the problems of the bad ones."""
    if not path.is_file():
        raise DataError(f"text data file {str(path)!r} does not exist or is not a file; pass one of "
                        f"{sorted(BUILTIN_LOADERS)}, a {TSV_SUFFIX} file or 'SRC_PATH,TGT_PATH'")
    if path.stat().st_size > MAX_TEXT_FILE_BYTES:
        raise DataError(f"{path}: is {path.stat().st_size} bytes, over the {MAX_TEXT_FILE_BYTES} byte limit")
    raw = path.read_bytes().split(b"\n")
    if raw[-1] == b"":
        raw.pop()  # the newline that ends the last line does not start another
    lines: Lines = []
    problems: list[tuple[int, str]] = []
    offset = 0  # byte offset of the current line in the file
    for number, chunk in enumerate(raw, start=1):
        where = f"line {number} of {path.name}" if name_file else f"line {number}"
        skip = len(UTF8_BOM) if number == 1 and chunk.startswith(UTF8_BOM) else 0
        try:
            text: str | None = chunk[skip:].decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as err:
            at = offset + skip + err.start
            problems.append((number, f"{where} is not UTF-8 (byte {at} of the file is 0x{chunk[at - offset]:02x})"))
            text = None
        if text is not None and len(text) > MAX_LINE_CHARS:
            problems.append((number, f"{where} has {len(text)} characters, over the limit of {MAX_LINE_CHARS}"))
            text = None
        lines.append((number, text))
        offset += len(chunk) + 1
    return lines, problems


def _finish(origin: str, sources: list[str], targets: list[str], problems: list[tuple[int, str]],
            expected: str) -> TextPairs:
    """The pairs, or one DataError listing every bad line in line order."""
    if problems:
        raise DataError(_listing(origin, [p for _, p in sorted(problems)], expected))
    if not sources:
        raise DataError(f"{origin}: holds no pairs (blank lines are skipped); {expected}")
    return TextPairs(sources, targets, origin)


def load_tsv(path: str | Path) -> TextPairs:
    """Pairs from `source<TAB>target` lines; blank lines skipped, each side stripped of surrounding spaces."""
    path = Path(path)
    lines, problems = _read_lines(path)
    sources, targets = [], []
    for number, line in lines:
        if line is None or not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            problems.append((number, f"line {number} has {len(parts) - 1} tabs, expected exactly 1"))
            continue
        source, target = (p.strip() for p in parts)
        bad = [f"{side} {why}" for side, text in (("source", source), ("target", target))
               if (why := _text_problem(text))]
        if bad:
            problems.append((number, f"line {number}: {' and '.join(bad)}"))
            continue
        sources.append(source)
        targets.append(target)
    return _finish(str(path), sources, targets, problems, f"expected UTF-8 lines 'source<TAB>target' of at most "
                                                          f"{MAX_LINE_CHARS} characters")


def load_parallel(source_path: str | Path, target_path: str | Path) -> TextPairs:
    """Pairs from two line-aligned files; lines blank in both are skipped, a side blank in one is an error."""
    paths = (Path(source_path), Path(target_path))
    (source_lines, source_problems), (target_lines, target_problems) = (_read_lines(p, True) for p in paths)
    origin = f"{paths[0]},{paths[1]}"
    if len(source_lines) != len(target_lines):
        raise DataError(f"{origin}: parallel files must have the same number of lines; {paths[0]} has "
                        f"{len(source_lines)}, {paths[1]} has {len(target_lines)}; line i of one must translate "
                        "line i of the other")
    problems = source_problems + target_problems
    sources, targets = [], []
    for (number, source), (_, target) in zip(source_lines, target_lines):
        if source is None or target is None or not (source.strip() or target.strip()):
            continue
        bad = [f"{side} {why}" for side, text in (("source", source), ("target", target))
               if (why := _text_problem(text.strip()))]
        if bad:
            problems.append((number, f"line {number}: {' and '.join(bad)}"))
            continue
        sources.append(source.strip())
        targets.append(target.strip())
    expected = f"expected UTF-8 lines of at most {MAX_LINE_CHARS} characters, line i of each file a pair"
    return _finish(origin, sources, targets, problems, expected)


def text_holdout_split(pairs: TextPairs) -> tuple[TextPairs, TextPairs]:
    """Deterministic split as for point data: a SPLIT_SEED permutation, HOLDOUT_FRACTION (at least one) held out."""
    if len(pairs) < 2:
        raise DataError(f"{pairs.origin}: holds {len(pairs)} pair; at least 2 are needed "
                        f"to hold out {HOLDOUT_FRACTION:.0%} as a test set")
    n_test = max(1, round(len(pairs) * HOLDOUT_FRACTION))
    order = np.random.default_rng(SPLIT_SEED).permutation(len(pairs))
    return pairs.subset(np.sort(order[n_test:])), pairs.subset(np.sort(order[:n_test]))


DataSource = str | Path | tuple[str | Path, str | Path]


def _resolve(name_or_path: DataSource) -> tuple[str, Any]:
    """(kind, what): a built-in name, a TSV path, or a (source, target) pair of paths."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_LOADERS:
        return name_or_path, name_or_path
    if isinstance(name_or_path, tuple) and len(name_or_path) == 2:
        return PARALLEL, tuple(Path(p) for p in name_or_path)
    if isinstance(name_or_path, str) and PAIR_SEPARATOR in name_or_path and not Path(name_or_path).is_file():
        parts = name_or_path.split(PAIR_SEPARATOR)
        if len(parts) == 2 and all(p.strip() for p in parts):
            return PARALLEL, tuple(Path(p.strip()) for p in parts)
    if isinstance(name_or_path, (str, Path)) and Path(name_or_path).suffix == TSV_SUFFIX:
        return TSV, Path(name_or_path)
    raise DataError(f"text data {str(name_or_path)!r} is neither a built-in data set {sorted(BUILTIN_LOADERS)}, "
                    f"a {TSV_SUFFIX} file, nor two line-aligned files 'SRC_PATH{PAIR_SEPARATOR}TGT_PATH'")


def load_text_dataset(name_or_path: DataSource) -> tuple[TextPairs, TextPairs]:
    """A built-in name -> its (train, test); a .tsv or 'SRC,TGT' files -> (train, held-out test)."""
    kind, what = _resolve(name_or_path)
    if kind in BUILTIN_LOADERS:
        return BUILTIN_LOADERS[kind]()
    return text_holdout_split(load_tsv(what) if kind == TSV else load_parallel(*what))


def describe_text_dataset(name_or_path: DataSource, train: TextPairs, test: TextPairs) -> dict[str, Any]:
    """Plain-JSON description of where the text came from, enough to reload and verify it."""
    kind, what = _resolve(name_or_path)
    sizes = {"n_train": len(train), "n_test": len(test)}
    if kind in BUILTIN_LOADERS:
        return {"name": kind, **copy.deepcopy(BUILTIN_PARAMS[kind]), **sizes}
    split = {"holdout_fraction": HOLDOUT_FRACTION, "split_seed": SPLIT_SEED, **sizes}
    if kind == TSV:
        return {"name": TSV, "path": str(what.resolve()), "sha256": sha256_file(what), **split}
    source, target = (p.resolve() for p in what)
    return {"name": PARALLEL, "source_path": str(source), "source_sha256": sha256_file(source),
            "target_path": str(target), "target_sha256": sha256_file(target), **split}


def reload_text_dataset(description: dict[str, Any]) -> tuple[TextPairs, TextPairs]:
    """Load the text a description names, refusing files that changed since it was described."""
    name = description.get("name")
    source: Any = {TSV: description.get("path"),
                   PARALLEL: (description.get("source_path"), description.get("target_path"))}.get(name, name)
    if not isinstance(source, str) and not (isinstance(source, tuple) and all(isinstance(p, str) for p in source)):
        raise DataError(f"text data description {description!r} names neither a built-in data set nor its files")
    return reload_unchanged(source, description, load_text_dataset, describe_text_dataset)
