"""Subword vocabularies: a Hugging Face `tokenizers` JSON read (the package is imported only when one is used)."""
from __future__ import annotations

import json
from typing import Any

from .errors import TokenizerUnavailableError, VocabError, brief
from .specials import SPECIAL_TOKENS

SUBWORD_EXTRA = "text"  # the pyproject extra that installs `tokenizers`


def _import_tokenizer_class() -> Any:
    """`tokenizers.Tokenizer`, imported only when a subword vocabulary is used."""
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise TokenizerUnavailableError(
            "tokenizer kind 'subword' needs the 'tokenizers' package, which is not installed; "
            f"install the '{SUBWORD_EXTRA}' extra: pip install -e '.[{SUBWORD_EXTRA}]' in a seq2onnx checkout "
            "(or pip install tokenizers)") from err
    return Tokenizer


def parse_tokenizer(text: str) -> Any:
    """A `tokenizers.Tokenizer` from its JSON text, refusing text it cannot read."""
    tokenizer_class = _import_tokenizer_class()
    try:
        return tokenizer_class.from_str(text)
    except Exception as err:  # tokenizers raises its own Exception subclasses for bad JSON
        try:  # valid JSON of another kind: the package's "expected `,` or `}`" would send the user to a parse error
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "model" not in parsed:
            raise VocabError(f"tokenizer JSON is JSON, but not a tokenizers file (it has no 'model': its keys are "
                             f"{brief(sorted(parsed))}); save one with Tokenizer.save(path)") from err
        raise VocabError(f"tokenizer JSON is not a tokenizers file (the tokenizers package says: {err}); "
                         "save it with Tokenizer.save(path)") from err


def tokens_of(tokenizer: Any, fixed: bool = True) -> tuple[str, ...]:
    """The tokenizer's tokens in id order; ids must be 0..n-1, with the four specials first (`fixed`: seq2onnx's
    own layout; a declared model's vocabulary names its own special ids)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)  # {token: id}
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabError(f"tokenizer ids must be 0..{len(by_id) - 1} without gaps; got {len(by_id)} tokens "
                         f"with ids from {by_id[0][1] if by_id else None} to {by_id[-1][1] if by_id else None}")
    tokens = tuple(t for t, _ in by_id)
    if fixed and tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
        raise VocabError(f"a subword tokenizer must hold the specials {list(SPECIAL_TOKENS)} at ids 0..3, "
                         f"got {list(tokens[:len(SPECIAL_TOKENS)])}; train it with "
                         f"special_tokens={list(SPECIAL_TOKENS)} (in that order) as the trainer's first tokens")
    return tokens


def pieces(tokenizer: Any, text: str) -> list[tuple[str, int | None]]:
    """The tokenizer's (token, id) pairs for `text`, and each run of the text that no token covers as (that text,
    None): a model without an unknown token (a BPE saved without `unk_token`) leaves characters it has no token for
    out without a word, so a text of them read as nothing and trained, evaluated and decoded as an empty one. A
    token the tokenizer reads as its own unknown token is given as the text it covers."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    unknown = getattr(tokenizer.model, "unk_token", None)
    unk = tokenizer.token_to_id(unknown) if isinstance(unknown, str) else None
    found: list[tuple[str, int | None]] = []
    covered = 0
    for token, i, (start, end) in zip(encoding.tokens, encoding.ids, encoding.offsets):
        if start > covered and text[covered:start].strip():
            found.append((text[covered:start].strip(), None))
        # a token read as the tokenizer's own unknown one is shown as the text it stood for ('z', not '<unk>')
        found.append((text[start:end] if i == unk and unk is not None and end > start else token, i))
        covered = max(covered, end)
    if text[covered:].strip():
        found.append((text[covered:].strip(), None))
    return found

