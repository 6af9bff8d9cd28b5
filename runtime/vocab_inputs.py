"""What callers hand a vocabulary, checked: texts, id sequences and vocabulary files (each refusal a VocabError
naming the input)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from .errors import VocabError, brief
from .specials import SPECIAL_TOKENS

TOKENIZER_KINDS = ("char", "whitespace", "subword")
BUILT_KINDS = ("char", "whitespace")  # the kinds a vocabulary is counted from texts for (subword: a trained tokenizer)
MAX_VOCAB_FILE_BYTES = 64 << 20  # a large BPE tokenizer JSON is a few MiB; more is not a vocabulary


def check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise VocabError(f"text must be a string, got {type(text).__name__}: {brief(text)}")


def check_regular(regular: tuple[str, ...], tokenizer: str, reserved: tuple[str, ...]) -> None:
    """Every non-special token of a vocabulary is a unique, non-empty string fitting the tokenizer kind, and none is
    one of the `reserved` special tokens."""
    bad = [t for t in regular if not isinstance(t, str) or not t]
    if bad:
        raise VocabError(f"vocabulary tokens must be non-empty strings, got {brief(bad[:5])}")
    duplicates = sorted(t for t, c in Counter(regular).items() if c > 1 or t in reserved)
    if duplicates:
        raise VocabError(f"vocabulary tokens must be unique (the specials included), "
                         f"got repeated {brief(duplicates[:5])}")
    if tokenizer == "char" and any(len(t) != 1 for t in regular):
        raise VocabError(f"a 'char' vocabulary holds single characters, got "
                         f"{brief([t for t in regular if len(t) != 1][:5])}")
    if tokenizer == "whitespace" and any(t.split() != [t] for t in regular):
        raise VocabError(f"a 'whitespace' vocabulary holds tokens without whitespace, got "
                         f"{brief([t for t in regular if t.split() != [t]][:5])}")


def plain_ids(ids: Any, size: int) -> bool:
    """ids is a list of Python ints in [0, size) (the runtime's own hypotheses), which need no check one by one."""
    return type(ids) is list and set(map(type, ids)) <= {int} and (not ids or 0 <= min(ids) <= max(ids) < size)


def id_list(ids: Any, size: int) -> list[int]:
    """ids (a sequence or 1-D array) as a list of ints in [0, size), else VocabError naming the first offender
    (checked one by one: numpy would read True as 1, and 1.5 beside ints as floats)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise VocabError(f"ids must be one sequence (1-D), got shape {ids.shape}; decode rows one at a time")
        values = ids.tolist()
    else:
        try:
            values = list(ids)
        except TypeError:
            raise VocabError(f"ids must be a sequence of ints, got {brief(ids)}") from None
        if any(isinstance(i, (list, tuple, np.ndarray)) for i in values):
            raise VocabError("ids must be one sequence (1-D) of ints, got nested sequences; decode rows one at a time")
    for position, i in enumerate(values):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not 0 <= i < size:
            raise VocabError(f"ids[{position}] must be an int in [0, {size}), got {brief(i)}")
    return [int(i) for i in values]


def read_text(path: Path, what: str) -> str:
    """A UTF-8 file of at most MAX_VOCAB_FILE_BYTES, or a VocabError naming it."""
    if not path.is_file():
        raise VocabError(f"{what} {str(path)!r} does not exist or is not a file")
    size = path.stat().st_size
    if size > MAX_VOCAB_FILE_BYTES:
        raise VocabError(f"{what} {str(path)!r} is {size} bytes, over the "
                         f"{MAX_VOCAB_FILE_BYTES} byte limit; it is not a vocabulary")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise VocabError(f"{what} {str(path)!r} is not UTF-8 (byte {data[err.start]:#04x} at offset {err.start} of the file)"
                         ) from err


def split_text(text: str, kind: str) -> list[str]:
    """Characters ('char') or whitespace-separated words ('whitespace')."""
    return list(text) if kind == "char" else text.split()


def built_tokens(texts: Any, kind: str, min_freq: int, max_size: int | None) -> tuple[str, ...]:
    """`Vocabulary.build`'s regular tokens: those seen at least `min_freq` times, most frequent first (ties by
    token), at most `max_size` less the specials; every argument checked first."""
    if kind == "subword":
        raise VocabError("a 'subword' vocabulary comes from a trained tokenizer, not from build(); "
                         "use Vocabulary.from_tokenizer_file(path) or from_tokenizer_json(text)")
    if kind not in BUILT_KINDS:
        raise VocabError(f"vocabulary kind must be one of {TOKENIZER_KINDS}, got {brief(kind)}")
    if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
        raise VocabError(f"min_freq must be an int >= 1, got {brief(min_freq)}")
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int)
                                 or max_size < len(SPECIAL_TOKENS)):
        raise VocabError(f"max_size counts the {len(SPECIAL_TOKENS)} specials too, so it must be None or an "
                         f"int >= {len(SPECIAL_TOKENS)}, got {brief(max_size)}")
    if isinstance(texts, str):
        raise VocabError(f"texts must be an iterable of strings, got one string {brief(texts)}; wrap it in a list")
    counts: Counter[str] = Counter()
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise VocabError(f"texts[{i}] must be a string, got {type(text).__name__}: {brief(text)}")
        counts.update(split_text(text, kind))
    kept = sorted((t for t, c in counts.items() if c >= min_freq and t not in SPECIAL_TOKENS),
                  key=lambda t: (-counts[t], t))
    return tuple(kept if max_size is None else kept[: max_size - len(SPECIAL_TOKENS)])
