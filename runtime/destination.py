"""What a writer may replace: only its own kind of artifact, never a directory that holds anything else.

Checkpoints (`train --out`) and exports (`export --out`) share these rules:
- never `/`, the home directory, the current directory or any directory that contains it;
- an empty directory, or none at all, is free to use;
- an existing artifact of the same kind is replaced only with `force`, and only when its marker file is seq2onnx's
  own (a JSON object with format_version and spec: a user's manifest.json or spec.json is not) and every entry in
  it is a file that seq2onnx writes there (a user's own file inside it would be lost, so it is refused too);
- anything else is refused even with `force`.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Callable

from .atomic_file import staged
from .contract import CHECKPOINT_SPEC_FILE, CHECKPOINT_WEIGHTS_FILE, MANIFEST_FILE
from .errors import Seq2OnnxError, clipped
from .siblings import NAME_MAX, STAGING_SUFFIX, sibling

# How many foreign entries a message lists before it says "...".
LISTED_ENTRIES = 5
PATH_MAX = 4096  # bytes in a whole path on Linux
MAX_MARKER_BYTES = 16 << 20  # a spec.json or manifest.json read to tell whether its directory is seq2onnx's


class DestinationError(Seq2OnnxError, FileExistsError):
    """The output path cannot be written: it is protected, holds someone else's files, or exists without force."""


def normalized(out: str | Path) -> Path:
    """An absolute path with `.` and `..` folded, so `--out .` has a name and a parent."""
    return Path(os.path.abspath(os.fspath(out)))


def protected_reason(out: Path) -> str | None:
    """Why `out` must never be written (root, home, cwd or one of its parents), or None."""
    target = out.resolve()
    if target == Path(target.anchor):
        return "it is the filesystem root"
    if target == Path.home().resolve():
        return "it is your home directory"
    cwd = Path.cwd().resolve()
    if target == cwd:
        return "it is the current directory"
    if target in cwd.parents:
        return "it contains the current directory"
    return None


def _ours(path: Path) -> bool:
    """Whether `path` is a JSON object of seq2onnx's (a checkpoint's spec.json or an export's manifest.json both hold
    format_version and spec), read only so far."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a named pipe there cannot hang the check
    except (OSError, ValueError):
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, socket or device is no marker of ours
            return False
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_MARKER_BYTES + 1)
        doc = json.loads(data) if len(data) <= MAX_MARKER_BYTES else None
    except (OSError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)
    return isinstance(doc, dict) and {"format_version", "spec"} <= set(doc)


def enclosing_artifact(out: Path) -> tuple[str, Path] | None:
    """(kind, directory) of the nearest seq2onnx checkpoint (its spec.json and weights.pt) or export (its
    manifest.json and a graph) that holds `out` below it, or None."""
    for parent in out.parents:
        try:
            names = set(os.listdir(parent))
        except OSError:  # not there yet, or not readable: nothing of ours to spoil
            continue
        if (kind := artifact_kind(parent, names)) is not None:
            return kind, parent
    return None


def artifact_kind(directory: Path, names: set[str]) -> str | None:
    """'checkpoint' or 'export' where `directory` (holding `names`) is a seq2onnx one, else None."""
    if {CHECKPOINT_SPEC_FILE, CHECKPOINT_WEIGHTS_FILE} <= names and _ours(directory / CHECKPOINT_SPEC_FILE):
        return "checkpoint"
    if MANIFEST_FILE in names and any(name.endswith(".onnx") for name in names) and _ours(directory / MANIFEST_FILE):
        return "export"
    return None


def too_long(path: Path, suffix: str = "") -> str | None:
    """Why `path` (and a sibling of it ending in `suffix`) cannot be a path on this system: a name over NAME_MAX
    bytes, or the whole over PATH_MAX; else None."""
    whole = len(os.fsencode(os.path.abspath(path)))
    if whole + len(suffix) > PATH_MAX:
        limit = f"{PATH_MAX - len(suffix)} (with the {suffix} beside it)" if suffix else str(PATH_MAX)
        return f"it is {whole} bytes long, more than the {limit} a path may have"
    for i, part in enumerate(path.parts):
        size = len(os.fsencode(part)) + (len(suffix) if i == len(path.parts) - 1 else 0)
        if size > NAME_MAX:
            limit = f"{NAME_MAX - len(suffix)} (with the {suffix} beside it)" if suffix else str(NAME_MAX)
            return f"its name {part[:16]!r}... is {size - len(suffix)} bytes long, more than the {limit} a name may have"
    return None


def _listed(names: list[str]) -> str:
    shown = names[:LISTED_ENTRIES]
    return str(shown)[:-1] + (", ...]" if len(names) > LISTED_ENTRIES else "]")


def check_destination(out: str | Path, force: bool, kind: str, marker: str, owned: frozenset[str],
                      sibling_suffix: str = "", marked: Callable[[Path], bool] | None = _ours) -> None:
    """Raise DestinationError unless writing the `kind` artifact to `out` loses nothing of the user's.

    `marker` is the file that identifies an artifact of this kind, where `marked(path)` says it is one (None: its
    name says so, for another engine's artifact); `owned` every name seq2onnx writes in it; `sibling_suffix`: a
    sibling `out` + suffix the writer also makes (a training run's `.partial`)."""
    out = normalized(out)
    article = "an" if kind[0] in "aeiou" else "a"
    example = {"checkpoint": "runs/NAME", "export": "models/NAME"}.get(kind, "NEW_DIR")
    reason = protected_reason(out)
    if reason is not None:
        raise DestinationError(f"{out}: refusing to write {article} {kind} there ({reason}); choose a new directory "
                               f"for --out, e.g. --out {example}")
    if (long := too_long(out, sibling_suffix)) is not None:
        raise DestinationError(f"{clipped(str(out), 120)}: {long}; choose a shorter --out")
    if kind == "export" and os.fsencode(out) != str(out).encode("utf-8", "surrogatepass"):  # bytes, not UTF-8 text
        if _utf8(os.fsencode(out)):  # UTF-8 bytes, which the locale (C, with Python's UTF-8 mode off) cannot read
            raise DestinationError(f"{str(out)!r}: the --out path is UTF-8, which this locale "
                                   f"({sys.getfilesystemencoding()}) cannot pass to torch's ONNX exporter; run in a "
                                   "UTF-8 locale (LC_ALL=C.UTF-8) or with PYTHONUTF8=1")
        raise DestinationError(f"{str(out)!r}: the --out path is not UTF-8 text, which torch's ONNX exporter cannot "
                               "write under; choose a path in UTF-8")
    if (inside := enclosing_artifact(out)) is not None:
        raise DestinationError(f"{out}: is inside the seq2onnx {inside[0]} {inside[1]}, which could then not be "
                               f"replaced (it would hold files seq2onnx does not write there); choose a directory "
                               f"beside it, e.g. --out {inside[1].parent / example.split('/')[-1]}")
    if not os.path.lexists(out):
        blocker = next((p for p in out.parents if os.path.lexists(p)), None)  # the nearest ancestor that exists
        if blocker is not None and not blocker.is_dir():
            what = "a broken link" if blocker.is_symlink() and not blocker.exists() else "a file, not a directory"
            raise DestinationError(f"{out}: cannot be created: {blocker} is {what}; choose another --out")
        return
    if out.is_symlink():
        where = "points nowhere" if not out.exists() else f"points to {os.readlink(out)}"
        raise DestinationError(f"{out}: is a link ({where}); refusing to write through it, even with --force; "
                               "choose another --out")
    if not out.is_dir():
        raise DestinationError(f"{out}: exists and is not a directory; refusing to replace it, even with --force; "
                               "choose another --out")
    entries = sorted(entry.name for entry in out.iterdir())
    if not entries:  # an empty directory holds nothing to lose; it is used as if written into
        if not os.access(out, os.W_OK | os.X_OK):
            raise DestinationError(f"{out}: is an empty directory this user cannot write into (mode "
                                   f"{stat.filemode(out.stat().st_mode)}); make it writable or choose another --out")
        return
    if marker not in entries:
        other = artifact_kind(out, set(entries))
        if other is not None and other != kind:  # the other kind's, given for this one
            raise DestinationError(f"{out}: is a seq2onnx {other}, not {article} {kind}, and {article} {kind} never "
                                   f"replaces it (--force replaces only {article} {kind}); choose another --out, e.g. "
                                   f"--out {example}")
        raise DestinationError(f"{out}: exists and is not a seq2onnx {kind} (no {marker}; it holds "
                               f"{_listed(entries)}); refusing to replace it, even with --force; choose another --out")
    if marked is not None and not marked(out / marker):  # a user's file of that name: names alone do not make it ours
        try:
            mode = os.lstat(out / marker).st_mode
        except OSError:  # gone since the listing: said as any file not ours
            mode = stat.S_IFREG
        what = ("seq2onnx's (a JSON object with format_version and spec)" if stat.S_ISREG(mode) or stat.S_ISLNK(mode)
                else f"a regular file (mode {stat.filemode(mode)})")
        raise DestinationError(f"{out}: holds a {marker} that is not {what}, so it is not a seq2onnx {kind} to "
                               "replace; refusing, even with --force; choose another --out")
    foreign = [name for name in entries if name not in owned]
    if foreign:
        raise DestinationError(f"{out}: is a seq2onnx {kind} but also holds files seq2onnx did not write "
                               f"({_listed(foreign)}); refusing to replace it, even with --force; move them out "
                               "or choose another --out")
    if not force:
        raise DestinationError(f"{out}: a seq2onnx {kind} already exists there; pass --force (force=True in "
                               "Python) to replace it, or choose another --out")


class OutputFileError(DestinationError):
    """A file output (--output, --json, --plot) that cannot be written: `exists` when the place is refused (a file
    already there without force, or a place inside a seq2onnx export or checkpoint: a refused destination, as for
    --out), else the path itself is unusable."""

    def __init__(self, message: str, exists: bool = False) -> None:
        super().__init__(message)
        self.exists = exists


def _inside_artifact(target: Path) -> tuple[str, Path] | None:
    """The seq2onnx export or checkpoint that `target` would be written inside: by its path as given ('..' folded),
    and by where the system would put it (its folder's links resolved: 'link/../export/x' is in the export the link's
    parent holds); a link at `target` itself is replaced, not followed, so it is not resolved."""
    given = normalized(target)
    real = Path(os.path.realpath(os.fspath(target.parent))) / target.name  # links resolved before '..' is applied
    return enclosing_artifact(given) or (enclosing_artifact(real) if real != given else None)


def _creation_refused(target: Path) -> str | None:
    """Why no file can be created beside `target`, found by creating (and removing) the staging sibling the write
    will use: os.access says yes to root on a read-only mount or in /proc, where the write then fails after the
    work is done."""
    probe = sibling(target, STAGING_SUFFIX)
    with staged(probe):  # a Ctrl-C between its making and its removal left it behind for good
        try:
            with open(probe, "xb"):
                pass
        except OSError as exc:
            return exc.strerror or type(exc).__name__
        probe.unlink(missing_ok=True)
    return None


def check_output_file(path: str | Path, force: bool, suffixes: tuple[str, ...] = ()) -> None:
    """Before any work: `path` names a file (not a folder, not empty) ending in one of `suffixes` (any name when
    empty) in an existing, writable folder outside every seq2onnx export and checkpoint, and no file or link there
    is replaced unless `force`. Raises
    OutputFileError whose message starts with the path; the caller adds the option's name. Publish with
    `runtime.atomic_file.write_file(..., replace=force)`, so a file that appears meanwhile is kept too."""
    text = os.fspath(path)
    if not text:
        raise OutputFileError("'': expected a file name, got an empty one")
    target = Path(text)
    if (long := too_long(target)) is not None:
        raise OutputFileError(f"{clipped(text, 120)}: {long}; choose a shorter name")
    if text.endswith(("/", os.sep)):
        raise OutputFileError(f"{text}: ends in '/', which names a directory; expected a file name")
    if target.is_dir():
        raise OutputFileError(f"{text}: is a directory; expected a file name")
    if suffixes and target.suffix.lower() not in suffixes:
        raise OutputFileError(f"{text}: expected a file name ending in {', '.join(suffixes)}")
    parent = target.parent
    held = _inside_artifact(target)
    if held is not None:  # --force would replace the artifact's own files (a manifest, a graph, a vocabulary)
        kind, directory = held
        raise OutputFileError(f"{text}: is inside the seq2onnx {kind} {str(directory)!r}, whose files an output never "
                              f"replaces (nor adds to); choose a path outside it", exists=True)
    if not parent.is_dir():
        blocking = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if blocking is not None and not blocking.is_dir():  # a file where the path needs a directory
            raise OutputFileError(f"{text}: {str(blocking)!r} is a file, not a directory; expected a file name in a "
                                  "directory")
        raise OutputFileError(f"{text}: directory {str(parent)!r} does not exist; create it first")
    refused = _creation_refused(target)
    if refused is not None:
        raise OutputFileError(f"{text}: no file can be made in directory {str(parent)!r} (the system said: {refused}); "
                              "choose another place")
    special = _special_file(target)
    if special is not None:  # --force replaces a file or a link: a pipe's reader would wait on it for ever
        raise OutputFileError(f"{text}: is {special}, not a file; an output replaces only a file or a link, even with "
                              "--force; choose another name", exists=True)
    if os.path.lexists(target) and not force:
        what = "a link" if target.is_symlink() else "a file"
        raise OutputFileError(f"{text}: {what} already exists there; pass --force to replace it, or choose another "
                              "name", exists=True)


SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _special_file(target: Path) -> str | None:
    """What `target` is where it is neither a regular file, a directory nor a link (None: one of those, or
    nothing there)."""
    try:
        mode = os.lstat(target).st_mode
    except OSError:
        return None
    return next((name for test, name in SPECIAL_FILES if test(mode)), None)


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
