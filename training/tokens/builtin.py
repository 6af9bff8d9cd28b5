"""The built-in text data sets, generated from fixed seeds (stdlib + numpy): reverse, toy-translation, lookup and
dates; what a checkpoint records of each, their tokenizer, and the held-out accuracy each should reach."""
from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

import numpy as np

from .pairs import TextPairs

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
