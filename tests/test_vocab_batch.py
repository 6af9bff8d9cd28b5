"""The batch paths of Vocabulary (encode_batch's rows, text_and_tokens for hypotheses) against the one-text ones
they stand for: the same ids, text, tokens and refusals, for char and whitespace vocabularies, seq2onnx's fixed
specials and declared ones (unk or not)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.specials import Specials
from runtime.vocab import SPECIAL_TOKENS, VocabError, Vocabulary

LETTERS = "abcdefg"


def _vocabulary(kind: str, declared: bool, has_unk: bool) -> Vocabulary:
    regular = tuple(LETTERS[:5]) if kind == "char" else ("ab", "c", "de", "fg", "a")
    if not declared:
        return Vocabulary(SPECIAL_TOKENS + regular, kind)
    # a declared layout: eos first, bos last, pad shared with eos, unk (if any) in the middle
    unk = ("[UNK]",) if has_unk else ()
    tokens = ("[EOS]", *regular[:2], *unk, *regular[2:], "[BOS]")
    specials = Specials(bos=len(tokens) - 1, eos=0, pad=0, unk=3 if has_unk else None)
    return Vocabulary(tokens, kind, specials=specials)


VOCABULARIES = st.builds(_vocabulary, st.sampled_from(["char", "whitespace"]), st.booleans(), st.booleans())


def _outcome(call: Any) -> Any:
    try:
        return call()
    except VocabError as err:
        return ("refused", str(err))


@settings(max_examples=300, deadline=None)
@given(VOCABULARIES, st.data())
def test_text_and_tokens_and_hypothesis_text_are_decode_and_the_tokens(vocab: Vocabulary, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(-2, len(vocab) + 1), max_size=12), label="ids")
    expected = _outcome(lambda: (vocab.decode(ids), [vocab.tokens[i] for i in ids]))
    assert _outcome(lambda: vocab.text_and_tokens(ids)) == expected
    assert _outcome(lambda: vocab.hypothesis_text(ids)) == expected  # the runtime's own lists: no type checks


def test_text_and_tokens_refuses_what_decode_refuses() -> None:
    vocab = _vocabulary("char", declared=False, has_unk=True)
    for ids in ([len(vocab)], [-1], [4, 5, 99]):
        with pytest.raises(VocabError, match=r"ids\[\d\] must be an int in \[0, 9\)"):
            vocab.text_and_tokens(ids)
    assert vocab.text_and_tokens([]) == ("", [])
    assert vocab.text_and_tokens([4, 3, 5]) == ("a<unk>b", ["a", "<unk>", "b"])  # unk is read, not left out
    assert vocab.text_and_tokens([4, 1, 0, 5, 2, 6]) == ("ab", ["a", "<s>", "<pad>", "b", "</s>", "c"])


IDS = {"array": lambda: np.array([4, 5]), "empty array": lambda: np.array([], dtype=np.int64),
       "tuple": lambda: (4, 5), "numpy ints": lambda: [np.int64(4), 5], "iterator": lambda: iter([4, 5]),
       "float": lambda: [5.0], "ints and a float": lambda: [4, 6.0], "numpy bool": lambda: [np.bool_(True)],
       "str item": lambda: ["a"], "None item": lambda: [4, None], "nested": lambda: [[4, 5]], "None": lambda: None,
       "int": lambda: 7, "str": lambda: "45"}


@pytest.mark.parametrize("make", IDS.values(), ids=IDS.keys())
def test_text_and_tokens_reads_and_refuses_what_decode_does(make: Any) -> None:
    vocab = _vocabulary("char", declared=False, has_unk=True)
    once = make()
    seen = list(once) if isinstance(once, Iterator) else once  # an iterator is read once: decode a copy
    expected = _outcome(lambda: (vocab.decode(seen), [vocab.tokens[i] for i in seen]))
    assert _outcome(lambda: vocab.text_and_tokens(make())) == expected


@pytest.mark.parametrize("flag", [True, False])
def test_bools_are_not_ids_even_where_the_id_would_be_kept(flag: bool) -> None:
    vocab = _vocabulary("whitespace", declared=True, has_unk=True)  # ids 1 and 2 are regular tokens here
    with pytest.raises(VocabError, match=rf"ids\[0\] must be an int in \[0, 8\), got {flag}"):
        vocab.text_and_tokens([flag])
    with pytest.raises(VocabError, match=rf"got {flag}"):
        vocab.decode([flag])


@settings(max_examples=300, deadline=None)
@given(VOCABULARIES, st.data())
def test_encode_batch_rows_are_encode_of_each_text(vocab: Vocabulary, data: st.DataObject) -> None:
    pieces = st.sampled_from([*(t for t in vocab.tokens if not t.startswith(("<", "["))), "z", "<s>", "[EOS]"])
    joiner = "" if vocab.tokenizer == "char" else " "
    texts = data.draw(st.lists(st.lists(pieces, max_size=6).map(joiner.join), max_size=5), label="texts")
    add_bos, add_eos = data.draw(st.booleans(), label="bos"), data.draw(st.booleans(), label="eos")

    def one_by_one() -> tuple[list[list[int]], list[int]]:
        rows = [vocab.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return rows, [len(r) for r in rows]

    expected = _outcome(one_by_one)
    got = _outcome(lambda: vocab.encode_batch(iter(texts), add_bos=add_bos, add_eos=add_eos))
    if expected[0] == "refused":
        assert got == expected  # a vocabulary without unk names the unknown token, as encode does
        return
    ids, lengths = got
    rows, expected_lengths = expected
    assert lengths.tolist() == expected_lengths
    for row, length, want in zip(ids.tolist(), lengths.tolist(), rows):
        assert row[:length] == want and set(row[length:]) <= {vocab.ids.filler}


@pytest.mark.parametrize("texts, says", [
    (["ab", 3], "text must be a string, got int: 3"),
    (["ab", None], "text must be a string, got NoneType"),
    ([b"ab"], "text must be a string, got bytes"),
])
def test_encode_batch_refuses_what_encode_refuses(texts: list, says: str) -> None:
    vocab = _vocabulary("char", declared=False, has_unk=True)
    with pytest.raises(VocabError, match=says):
        vocab.encode_batch(texts)


def test_a_str_subclass_encodes_as_its_text() -> None:
    class Text(str):
        pass

    vocab = _vocabulary("whitespace", declared=True, has_unk=False)
    ids, lengths = vocab.encode_batch([Text("ab de"), "c"])
    assert ids.tolist() == [[1, 3, 0], [2, 0, 0]] and lengths.tolist() == [3, 2]
    assert ids.dtype == np.int64
