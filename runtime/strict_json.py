"""JSON read strictly: `json.loads` keeps the last of a repeated key and reads 1e400 as infinity, both silently;
`loads` refuses them, for `infer --input` and the HTTP API alike."""
from __future__ import annotations

import json
from typing import Any


class JsonRefused(ValueError):
    """Valid JSON that json.loads would quietly bend (a repeated key, a number beyond every float)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise JsonRefused(f"JSON object gives the key(s) {twice} more than once; give each once")
    return dict(pairs)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonRefused(f"JSON number {text} is beyond the float32 range (+-3.4e38); send numbers within it")
    return value


def loads(data: bytes | str) -> Any:
    """json.loads, with a repeated key or a number that would read as infinity refused (JsonRefused). NaN and
    Infinity written as such stay Python's (the runtime refuses them where numbers must be finite)."""
    return json.loads(data, object_pairs_hook=_unique_keys, parse_float=_finite_float)
