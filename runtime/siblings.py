"""The hidden names a writer uses beside its destination `out`, and the tidying of a killed writer's ones.

`.<name>.lock` (the writer's lock, `runtime.writer_lock`), `.<name>.<12 hex>.tmp` (a tree or file being staged, or
an old tree being deleted: garbage) and `.<name>.<12 hex>.old` (only in `runtime.atomic`'s two-rename fallback: a
complete previous `out`). Where `name` is too long to carry the marks, a shortened stem stands for it (`stem`).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path

UUID_HEX_CHARS = 12  # length of the random part of a sibling's name
STAGING_SUFFIX = ".tmp"
BACKUP_SUFFIX = ".old"
LOCK_SUFFIX = ".lock"
NAME_MAX = 255  # bytes in one name on Linux's file systems
# a sibling's marks around its stem: '.', '.', the random hex and the longest suffix (a lock's name has fewer)
SIBLING_MARKS = 2 + UUID_HEX_CHARS + max(len(s) for s in (STAGING_SUFFIX, BACKUP_SUFFIX, LOCK_SUFFIX))


def stem(name: str) -> str:
    """The part of a sibling's name that stands for `name`: `name` itself, or, where `name` leaves no room for the
    sibling's marks within NAME_MAX bytes, its start and a hash of the whole (so a file of a valid long name can
    still be written through a sibling)."""
    raw = os.fsencode(name)
    room = NAME_MAX - SIBLING_MARKS
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:8]
    cut = room - len(digest) - 1
    while cut and raw[cut] & 0xC0 == 0x80:  # not inside a UTF-8 character
        cut -= 1
    return os.fsdecode(raw[:cut]) + "~" + digest


def sibling(path: Path, suffix: str) -> Path:
    """A fresh hidden name beside `path` (same filesystem, so renames are atomic)."""
    return path.with_name(f".{stem(path.name)}.{uuid.uuid4().hex[:UUID_HEX_CHARS]}{suffix}")


def _leftover_pattern(out: Path) -> re.Pattern[str]:
    suffixes = "|".join(re.escape(s) for s in (STAGING_SUFFIX, BACKUP_SUFFIX))
    return re.compile(rf"\.{re.escape(stem(out.name))}\.[0-9a-f]{{{UUID_HEX_CHARS}}}({suffixes})")


def leftovers(out: str | Path) -> list[Path]:
    """Our hidden siblings of `out` (`.<name>.<12 hex>.tmp` / `.old`); nothing else matches."""
    out = Path(os.path.abspath(out))
    pattern = _leftover_pattern(out)
    try:
        names = os.listdir(out.parent)
    except FileNotFoundError:
        return []
    return sorted(out.parent / name for name in names if pattern.fullmatch(name))


def clean_leftovers(out: str | Path) -> None:
    """Remove a killed writer's staging and backup siblings; first restore `out` from a backup if it is missing.

    Call it holding `exclusive(out)`. A missing `out` beside an `.old` means a kill between the two renames of
    the fallback publish: the `.old` is the complete previous `out` (one being deleted is renamed `.tmp` first)."""
    out = Path(os.path.abspath(out))
    stale = leftovers(out)
    backups = [p for p in stale if p.name.endswith(BACKUP_SUFFIX)]
    if backups and not os.path.lexists(out):
        newest = max(backups, key=lambda p: p.lstat().st_ctime)  # a rename sets ctime: the last one moved aside
        os.rename(newest, out)
        stale.remove(newest)
    for path in stale:
        remove(path)


def remove(path: Path) -> None:
    """Delete a file or a whole tree; already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
