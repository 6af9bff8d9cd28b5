"""Answers written as JSON on the event loop without holding it: a large answer (a long point decode, attention over
long texts) is encoded a part at a time, and the loop serves other requests between the parts.

`json.dumps` (and numpy's `tolist`) run in C holding the GIL, so another thread would hold the loop just the same: a
32 x 10,000-point answer took 1.0 s, during which no other request was answered. Here no part holds more than about
PART_NUMBERS numbers, and the text is byte for byte `json.dumps(payload, ensure_ascii=False, allow_nan=False,
separators=(",", ":"))` of the payload with every numpy array as its `tolist()`."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

PART_NUMBERS = 16_384  # numbers (or strings) encoded between two turns of the loop: ~10-20 ms of json.dumps here


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_plain)


def _plain(value: Any) -> Any:
    """What json writes for a numpy array: its tolist()."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def size(value: Any) -> int:
    """About how many scalars `value` holds: lists are taken as rectangular (their first item's size, times their
    length), so this costs one walk down, not a walk of everything."""
    if isinstance(value, np.ndarray):
        return max(1, value.size)
    if isinstance(value, list):
        return len(value) * size(value[0]) if value else 1
    if isinstance(value, dict):
        return sum(size(item) for item in value.values()) or 1
    return 1


async def json_bytes(payload: Any) -> bytes:
    """`payload` as UTF-8 JSON (as `_dumps` writes it); where it holds more than PART_NUMBERS scalars, written a
    part at a time with the event loop served between the parts."""
    if size(payload) <= PART_NUMBERS:
        return _dumps(payload).encode("utf-8")
    parts: list[str] = []
    await _write(payload, parts, [0])
    return "".join(parts).encode("utf-8")


async def _write(value: Any, parts: list[str], since: list[int]) -> None:
    """Append `value`'s JSON to parts: whole where small; a large list in runs of items of about PART_NUMBERS
    scalars (one item at a time where an item is larger), a large dict value by value; a turn of the loop every
    PART_NUMBERS scalars written."""
    n = size(value)
    if isinstance(value, dict) and n > PART_NUMBERS:
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            parts.append(("," if i else "") + _dumps(key if isinstance(key, str) else _dumps(key)) + ":")
            await _write(item, parts, since)
        parts.append("}")
        return
    if not (n > PART_NUMBERS and (isinstance(value, list) or isinstance(value, np.ndarray) and value.ndim > 0)):
        parts.append(_dumps(value))
        await _written(n, since)
        return
    each = size(value[0])
    if each > PART_NUMBERS:
        parts.append("[")
        for i, item in enumerate(value):
            parts.append("," if i else "")
            await _write(item, parts, since)
        parts.append("]")
        return
    run = max(1, PART_NUMBERS // each)
    for start in range(0, len(value), run):
        items = value[start:start + run]
        parts.append(("," if start else "[") + _dumps(items)[1:-1])  # the items, without their list's brackets
        await _written(len(items) * each, since)
    parts.append("]")


async def _written(count: int, since: list[int]) -> None:
    """Count scalars written; a turn of the event loop once PART_NUMBERS have been since the last."""
    since[0] += count
    if since[0] >= PART_NUMBERS:
        since[0] = 0
        await asyncio.sleep(0)
