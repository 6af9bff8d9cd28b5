"""JSON read strictly: `json.loads` keeps the last of a repeated key and reads 1e400 as infinity, both silently,
and fails with a bare ValueError on an integer of more digits than Python converts; `loads` refuses all three by
name (JsonRefused), for `infer --input` and the HTTP API alike."""
from __future__ import annotations

import json
import sys
from typing import Any

INT64 = 2**63
FLOAT64_MAX = int(sys.float_info.max)


class JsonRefused(ValueError):
    """Valid JSON that json.loads would quietly bend or fail on without saying where (a repeated key, a number
    beyond every float, an integer of too many digits)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise JsonRefused(f"JSON object gives the key(s) {twice} more than once; give each once")
    return dict(pairs)


def _shown(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"


def _finite(text: str, value: float) -> float:
    if value in (float("inf"), float("-inf")):
        raise JsonRefused(f"JSON number {_shown(text)} is too large for any float (it would read as infinity); "
                          "send finite numbers")
    return value


def _float(text: str) -> float:
    return _finite(text, float(text))


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # more digits than sys.get_int_max_str_digits() lets Python convert
        raise JsonRefused(f"JSON integer {_shown(text)} has more digits than the {sys.get_int_max_str_digits()} "
                          "read here; send numbers of fewer digits") from None
    if abs(value) > FLOAT64_MAX:  # no field here takes a number past every float
        _finite(text, float("inf"))
    return value


def _int_or_float(text: str) -> int | float:
    value = _int(text)
    return value if -INT64 <= value < INT64 else float(value)


def loads(data: bytes | str, wide_ints_as_floats: bool = False) -> Any:
    """json.loads, with a repeated key, a number that would read as infinity or an integer of too many digits
    refused (JsonRefused). `wide_ints_as_floats`: integers beyond int64 read as floats, where every number is
    data for a float array (numpy would otherwise hold them as objects), as a float field of the HTTP schemas reads
    them. NaN and Infinity written as such stay Python's (the runtime refuses them where numbers must be finite)."""
    return json.loads(data, object_pairs_hook=_unique_keys, parse_float=_float,
                      parse_int=_int_or_float if wide_ints_as_floats else _int)
