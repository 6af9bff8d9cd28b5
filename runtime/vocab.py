"""Vocabularies of token models: text <-> ids in one JSON file (stdlib + numpy; `tokenizers` only for subword)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .atomic_file import write_file
from .errors import TokenizerUnavailableError, VocabError, brief  # noqa: F401  (imported from here too)
from .specials import (  # noqa: F401  (the fixed ids and tokens: imported from here across the project)
    BOS,
    BOS_TOKEN,
    EOS,
    EOS_TOKEN,
    FIXED,
    PAD,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    UNK,
    UNK_TOKEN,
    Specials,
    SpecialsError,
)
from .subword import parse_tokenizer, pieces, tokens_of
from .vocab_inputs import (
    TOKENIZER_KINDS,
    built_tokens,
    check_regular,
    check_text,
    id_list,
    plain_ids,
    read_text,
    split_text,
)

JOINERS = {"char": "", "whitespace": " "}  # how `decode` glues tokens back into text
ID_DTYPE = np.int64
VOCAB_FORMAT_VERSION = 1
SUPPORTED_VOCAB_VERSIONS = (1,)
VOCAB_KEYS = ("format_version", "tokenizer", "tokens")  # plus "tokenizer_json" for subword, only there


@dataclass(frozen=True)
class Vocabulary:
    """Tokens and the tokenizer kind that splits text into them. seq2onnx's own vocabularies hold the specials
    <pad> <s> </s> <unk> at ids 0..3 (`specials` None); a declared model's (`specials` given) may put its own
    anywhere, and lack pad or unk."""

    tokens: tuple[str, ...]
    tokenizer: str = "char"
    tokenizer_json: str | None = None  # subword only: the Hugging Face tokenizer, so one file holds everything
    specials: Specials | None = None  # None: the fixed layout (runtime.specials.FIXED)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _subword: list[Any] = field(init=False, repr=False, compare=False)  # the loaded Tokenizer, once used
    _dropped: frozenset[int] = field(init=False, repr=False, compare=False)  # the specials decode leaves out

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZER_KINDS:
            raise VocabError(f"vocabulary 'tokenizer' must be one of {TOKENIZER_KINDS}, got {brief(self.tokenizer)}")
        if isinstance(self.tokens, str) or not isinstance(self.tokens, Sequence):
            raise VocabError(f"vocabulary 'tokens' must be a list of strings, got {type(self.tokens).__name__}")
        tokens = tuple(self.tokens)
        object.__setattr__(self, "tokens", tokens)
        if self.specials is None and tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise VocabError(f"vocabulary 'tokens' must start with the specials {list(SPECIAL_TOKENS)} "
                             f"(ids {PAD}..{UNK}), got {brief(list(tokens[:len(SPECIAL_TOKENS)]))}")
        if self.specials is not None:
            if not isinstance(self.specials, Specials):
                raise VocabError(f"vocabulary 'specials' must be a Specials or None, got {brief(self.specials)}")
            try:
                self.specials.check_fits(len(tokens), "vocabulary")
            except SpecialsError as err:
                raise VocabError(str(err)) from None
        special = self.ids.ids
        check_regular(tuple(t for i, t in enumerate(tokens) if i not in special), self.tokenizer,
                      SPECIAL_TOKENS if self.specials is None else ())
        if (self.tokenizer == "subword") != isinstance(self.tokenizer_json, str):
            raise VocabError(f"vocabulary 'tokenizer_json' must be the tokenizer's JSON text when tokenizer is "
                             f"'subword' and absent otherwise; got tokenizer {self.tokenizer!r} and "
                             f"tokenizer_json of type {type(self.tokenizer_json).__name__}")
        regular = {t: i for i, t in enumerate(tokens) if i not in special}  # text never yields specials
        object.__setattr__(self, "_index", regular)
        object.__setattr__(self, "_subword", [])
        object.__setattr__(self, "_dropped", special - {self.ids.unk})

    @property
    def ids(self) -> Specials:
        """This vocabulary's special ids: its own, or the fixed layout."""
        return FIXED if self.specials is None else self.specials

    # -- building ------------------------------------------------------------------------------------------------

    @classmethod
    def build(cls, texts: Iterable[str], kind: str, min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """Tokens seen at least `min_freq` times, most frequent first (ties by token), at most `max_size` in all."""
        return cls(SPECIAL_TOKENS + built_tokens(texts, kind, min_freq, max_size), kind)

    @classmethod
    def from_tokenizer_json(cls, text: str, specials: Specials | None = None) -> Vocabulary:
        """A subword vocabulary holding a Hugging Face `tokenizers` JSON: seq2onnx's layout (specials <pad> <s> </s>
        <unk> at ids 0..3), or a declared model's own `specials`."""
        if not isinstance(text, str):
            raise VocabError(f"tokenizer JSON must be text, got {type(text).__name__}")
        return cls(tokens_of(parse_tokenizer(text), fixed=specials is None), "subword", text, specials)

    @classmethod
    def from_tokenizer_file(cls, path: str | Path, specials: Specials | None = None) -> Vocabulary:
        """`from_tokenizer_json` on the file a `Tokenizer.save(path)` wrote."""
        return cls.from_tokenizer_json(read_text(Path(path), "tokenizer file"), specials)

    # -- text <-> ids ----------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tokens)

    def _tokenizer_object(self) -> Any:
        """The loaded subword tokenizer; checked once against `tokens` (a racing second load is harmless)."""
        if not self._subword:
            tokenizer = parse_tokenizer(self.tokenizer_json or "")
            if tokens_of(tokenizer, fixed=self.specials is None) != self.tokens:
                raise VocabError("vocabulary 'tokens' do not match its tokenizer_json's vocabulary; "
                                 "rebuild it with Vocabulary.from_tokenizer_json")
            self._subword.append(tokenizer)
        return self._subword[0]

    def check_usable(self) -> None:
        """Raise TokenizerUnavailableError now if encoding would need a package that is not installed."""
        if self.tokenizer == "subword":
            self._tokenizer_object()

    def tokenize(self, text: str) -> list[str]:
        """Split text into tokens: characters, whitespace-separated words, or the tokenizer's pieces."""
        check_text(text)
        if self.tokenizer == "subword":  # (a run of text without a token of its own is one, read as unknown)
            return [token for token, _ in pieces(self._tokenizer_object(), text)]
        return split_text(text, self.tokenizer)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = True) -> list[int]:
        """Token ids of text; unknown tokens, and specials written in the text, become the unknown id (a
        vocabulary without one refuses them by name)."""
        check_text(text)
        specials = self.ids
        if self.tokenizer == "subword":  # text it has no token for (it left it out) reads as unknown too
            found = pieces(self._tokenizer_object(), text)
            ids = [specials.unk if i is None or i in specials.ids else i for _, i in found]
            lacking = [token for token, i in found if i is None]
        else:
            ids = [self._index.get(t, specials.unk) for t in split_text(text, self.tokenizer)]
            lacking = [t for t in split_text(text, self.tokenizer) if t not in self._index] if None in ids else []
        if specials.unk is None and None in ids:
            unknown = lacking or ["(a special)"]
            raise VocabError(f"text {brief(text)}: token {unknown[0]!r} is not in the vocabulary, which has no "
                             "unknown-token id to stand for it; use tokens of the vocabulary")
        return [specials.bos] * add_bos + ids + [specials.eos] * add_eos

    def unknown_tokens(self, text: str) -> list[str]:
        """The tokens of `text` that `encode` reads as the unknown id, in order: what `seq2onnx infer`'s note names,
        for a service that wants to say so. A vocabulary without an unknown id has none: `encode`, and so this,
        refuses such a token by name (VocabError)."""
        ids, unk = self.encode(text, add_eos=False), self.ids.unk
        return [token for token, i in zip(self.tokenize(text), ids, strict=True) if i == unk] if unk in ids else []

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids up to the first EOS; PAD and BOS are skipped, UNK reads as <unk> (subword: the tokenizer's
        own decoding, which skips special tokens)."""
        # the API's own lists as they are; anything else, and every refusal, checked one by one
        values = ids if plain_ids(ids, len(self.tokens)) else id_list(ids, len(self.tokens))
        specials = self.ids
        if specials.eos in values:
            values = values[:values.index(specials.eos)]
        kept = [i for i in values if i not in self._dropped]
        if self.tokenizer == "subword":
            return str(self._tokenizer_object().decode([i for i in kept if i != specials.unk],
                                                       skip_special_tokens=True))
        return JOINERS[self.tokenizer].join(self.tokens[i] for i in kept)

    def text_and_tokens(self, ids: list[int]) -> tuple[str, list[str]]:
        """(decode(ids), [tokens[i] for i in ids]), refusals included, in less time (`hypothesis_text`)."""
        return self._joined(ids if plain_ids(ids, len(self.tokens)) else id_list(ids, len(self.tokens)))

    def hypothesis_text(self, ids: list[int]) -> tuple[str, list[str]]:
        """text_and_tokens of the runtime's own lists of Python ints (a graph's ids `.tolist()`: no type checks, 1.5
        us of 3.6 for 20 ids; the range is checked), the text joined from the tokens where decode drops none."""
        if ids and not 0 <= min(ids) <= max(ids) < len(self.tokens):
            ids = id_list(ids, len(self.tokens))  # refuses the first id out of range, as decode does
        return self._joined(ids)

    def _joined(self, ids: list[int]) -> tuple[str, list[str]]:
        """text_and_tokens of ints known to be ids of this vocabulary."""
        pieces = [self.tokens[i] for i in ids]
        if self.tokenizer != "subword" and self._dropped.isdisjoint(ids):
            return JOINERS[self.tokenizer].join(pieces), pieces
        return self.decode(ids), pieces

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = True,
                     reverse: bool = False, width: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Ids (N, max(width, longest)) int64 right-padded with PAD, and each row's length (N,) int64; `reverse`
        reverses each text's tokens (BOS and EOS stay where they are). Built from Python lists, one numpy call per
        array: a decode at batch 1 runs measurably slower after more numpy work (benchmarks/api_overhead.py)."""
        if type(texts) is not list:  # the ABC's check is slow: lists pass first
            if isinstance(texts, str):
                raise VocabError(f"texts must be a list of strings, got one string {brief(texts)}; wrap it in a list")
            if not isinstance(texts, Iterable):
                raise VocabError(f"texts must be a list of strings, got {brief(texts)}")
        if type(width) is not int and (isinstance(width, bool) or not isinstance(width, int)) or width < 0:
            raise VocabError(f"width must be an int >= 0 (the least padded length), got {brief(width)}")
        specials = self.ids
        head, tail = [specials.bos] * add_bos, [specials.eos] * add_eos
        rows = self._rows(list(texts))
        lengths = []
        for i, row in enumerate(rows):  # loops, not comprehensions: fewer frames for a decode's one or few texts
            row = rows[i] = head + (row[::-1] if reverse else row) + tail
            lengths.append(len(row))
            width = max(width, len(row))
        filler = specials.filler
        for row in rows:
            if len(row) < width:
                row += [filler] * (width - len(row))
        ids = np.array(rows, dtype=ID_DTYPE)
        return ids if rows else ids.reshape(0, width), np.array(lengths, dtype=ID_DTYPE)

    def _rows(self, texts: list[str]) -> list[list[int]]:
        """encode(text, add_eos=False) of each text; 'char' and 'whitespace' in one pass where every text is a str
        and every token known or read as unk (else text by text, for encode's refusals)."""
        unk = self.ids.unk
        if self.tokenizer != "subword":
            get, chars, rows = self._index.get, self.tokenizer == "char", []
            for text in texts:
                if type(text) is not str:
                    break
                rows.append([get(token, unk) for token in (text if chars else text.split())])
            else:
                if unk is not None or not any(None in r for r in rows):
                    return rows
        return [self.encode(t, add_bos=False, add_eos=False) for t in texts]

    # -- storage ---------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, the inverse of `from_dict`."""
        data: dict[str, Any] = {"format_version": VOCAB_FORMAT_VERSION, "tokenizer": self.tokenizer,
                                "tokens": list(self.tokens)}
        if self.tokenizer_json is not None:
            data["tokenizer_json"] = self.tokenizer_json
        if self.specials is not None:  # the fixed layout writes what it always wrote (and hashes the same)
            data["specials"] = self.specials.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Vocabulary:
        """Rebuild a vocabulary, refusing unknown or missing keys and unknown format versions."""
        if not isinstance(data, dict):
            raise VocabError(f"vocabulary must be a JSON object, got {type(data).__name__}")
        expected = set(VOCAB_KEYS) | ({"tokenizer_json"} if data.get("tokenizer") == "subword" else set())
        expected |= {"specials"} & set(data)  # optional: a declared model's own special ids
        unknown, missing = sorted(set(data) - expected), sorted(expected - set(data))
        if unknown or missing:
            raise VocabError(f"vocabulary keys must be {sorted(expected)}; unknown {unknown}, missing {missing}")
        version = data["format_version"]
        if type(version) is not int:
            raise VocabError(f"vocabulary format_version must be an integer, got {type(version).__name__} "
                             f"{brief(version)}")
        if version not in SUPPORTED_VOCAB_VERSIONS:
            raise VocabError(f"vocabulary format_version {brief(version)} is not understood; "
                             f"this seq2onnx reads versions {list(SUPPORTED_VOCAB_VERSIONS)}")
        if not isinstance(data["tokens"], list):
            raise VocabError(f"vocabulary 'tokens' must be a list, got {type(data['tokens']).__name__}")
        try:
            specials = Specials.from_dict(data["specials"]) if "specials" in data else None
        except SpecialsError as err:
            raise VocabError(f"vocabulary 'specials': {err}") from None
        return cls(tuple(data["tokens"]), data["tokenizer"], data.get("tokenizer_json"), specials)

    def canonical_json(self) -> str:
        """The one text `sha256` hashes: sorted keys, no spaces, UTF-8 kept as is."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def sha256(self) -> str:
        """Hex sha256 of the canonical JSON; equal vocabularies hash equal on every run and machine."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def save(self, path: str | Path) -> None:
        """Write JSON (indent 2, sorted keys) whole or not at all: a temporary file beside it, then a rename."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_file(path, lambda f: f.write(text.encode("utf-8")))

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read a vocabulary `save` wrote."""
        text = read_text(Path(path), "vocabulary file")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise VocabError(f"vocabulary file {str(path)!r} is not valid JSON ({err})") from err
        try:
            return cls.from_dict(data)
        except VocabError as err:
            raise VocabError(f"vocabulary file {str(path)!r}: {err}") from err
