"""What every kind's data sets share (numpy + stdlib): the error they raise, the held-out split's fraction and seed,
and reloading a run's data only when it is unchanged."""
from __future__ import annotations

from typing import Any, Callable

# A user's file is split by a fixed-seed permutation, so sorted files still give a representative test set.
HOLDOUT_FRACTION = 0.2
SPLIT_SEED = 0


class DataError(ValueError):
    """Training data is missing, unreadable or malformed."""


def reload_unchanged(source: Any, description: dict[str, Any], load: Callable[[Any], tuple[Any, Any]],
                     describe: Callable[[Any, Any, Any], dict[str, Any]]) -> tuple[Any, Any]:
    """(train, test) from `load(source)`, refused when their description differs from the saved one."""
    train, test = load(source)
    now = describe(source, train, test)
    if now != description:
        keys = [k for k in list(description) + [k for k in now if k not in description]
                if description.get(k) != now.get(k)]
        changes = "; ".join(f"{k} {_shown(description.get(k))} then, {_shown(now.get(k))} now" for k in keys)
        raise DataError(f"data {source!r} changed since the run started ({changes}); "
                        "restore the original files or start a new run without --resume")
    return train, test


def _shown(value: Any) -> str:
    """A description's value in a message: a hash by its first 12 digits."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "..."
    return "(none)" if value is None else repr(value)
