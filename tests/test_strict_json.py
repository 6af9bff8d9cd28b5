"""runtime.strict_json: its fast path (json's own C number conversion, taken where the text cannot hold a number the
checks would refuse or widen) reads every text as the checked path does."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import strict_json
from runtime.strict_json import JsonRefused


def checked(text: str, wide: bool) -> Any:
    """The checks on every number, as loads runs them where its sketch says they may be needed."""
    return json.loads(text, object_pairs_hook=strict_json._unique_keys, parse_float=strict_json._float,
                      parse_int=strict_json._int_or_float if wide else strict_json._int)


def outcome(read: Any, text: str, wide: bool) -> Any:
    try:
        return ("value", repr(read(text, wide)))
    except JsonRefused as exc:
        return ("refused", str(exc))


EDGES = ["1e400", "-1E+400", "1e0400", "1e-400", "1e99", "9" * 99 + "e99", "9" * 250 + "e99", "1" + "0" * 400,
         "9" * 5000, "9223372036854775807", "9223372036854775808", "-9223372036854775809", "1.7976931348623157e308",
         "1.8e308", "Infinity", "-Infinity", "NaN", '{"a": 1, "a": 2}', '{"e100": 12}', '["1e400"]', "[0.5, 1e-5]"]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("text", EDGES)
def test_edges_read_as_the_checked_path_reads_them(text: str, wide: bool) -> None:
    assert outcome(strict_json.loads, text, wide) == outcome(checked, text, wide)


NUMBER = st.from_regex(r"-?(0|[1-9][0-9]{0,120})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(NUMBER, min_size=1, max_size=8), st.booleans())
def test_numbers_read_as_the_checked_path_reads_them(numbers: list[str], wide: bool) -> None:
    text = "[" + ", ".join(numbers) + "]"
    assert outcome(strict_json.loads, text, wide) == outcome(checked, text, wide)
    assert outcome(strict_json.loads, text.encode(), wide) == outcome(checked, text, wide)
