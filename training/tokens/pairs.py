"""Aligned source and target texts, checked once on the way in (stdlib + numpy)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from training.data import DataError

MAX_LINE_CHARS = 1000  # per file line (TSV: both sides and the tab), and per source or target
MAX_BAD_SHOWN = 5  # bad lines quoted in one error; the rest are counted
FORBIDDEN_CHARS = ("\t", "\n", "\r")  # a pair must fit on one TSV line


def text_problem(text: Any) -> str | None:
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


def listing(origin: str, problems: list[str], expected: str) -> str:
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
                    for side, text in zip(("source", "target"), pair) if (why := text_problem(text))]
        if problems:
            raise DataError(listing(self.origin, problems, f"non-empty strings of at most {MAX_LINE_CHARS} "
                                                            "characters, without tabs or line breaks"))

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, index: Sequence[int] | np.ndarray) -> TextPairs:
        """The pairs at `index`, in that order."""
        return TextPairs([self.sources[i] for i in index], [self.targets[i] for i in index], self.origin)
