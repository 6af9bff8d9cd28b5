"""Text data for token models: a built-in set by name (`training.tokens.builtin`), or user TSV / parallel files
held out as for point data; described in a checkpoint and reloaded only when unchanged (stdlib + numpy)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from runtime.defaults import LONE_CR, NUL, TSV_SUFFIX, UTF8_BOM, UTF16_BOMS
from runtime.model_files import sha256_file
from training.data import HOLDOUT_FRACTION, SPLIT_SEED, DataError, reload_unchanged

from .builtin import BUILTIN_LOADERS, BUILTIN_PARAMS
from .pairs import MAX_LINE_CHARS, TextPairs, listing, text_problem

MAX_TEXT_FILE_BYTES = 1 << 30  # 1 GiB: files are read whole
TSV, PARALLEL = "tsv", "parallel"
PAIR_SEPARATOR = ","  # "SRC_PATH,TGT_PATH" names two line-aligned files
MAX_LEN_MARGIN = 5  # evaluation decodes this many steps past the longest reference target (EOS included)


Lines = list[tuple[int, str | None]]  # (1-based line number, text, or None when the line is bad)


def _read_lines(path: Path, name_file: bool = False) -> tuple[Lines, list[tuple[int, str]]]:
    """Every line of a UTF-8 file (CRLF and a leading BOM accepted), and the problems of the bad ones."""
    if not path.is_file():
        raise DataError(f"text data file {str(path)!r} does not exist or is not a file; pass one of "
                        f"{sorted(BUILTIN_LOADERS)}, a {TSV_SUFFIX} file or 'SRC_PATH,TGT_PATH'")
    if path.stat().st_size > MAX_TEXT_FILE_BYTES:
        raise DataError(f"{path}: is {path.stat().st_size} bytes, over the {MAX_TEXT_FILE_BYTES} byte limit")
    data = path.read_bytes()
    if data[:2] in UTF16_BOMS:  # every line refused as not UTF-8, then counted wrong: the encoding is the cause
        raise DataError(f"{path}: is UTF-16 (it starts with UTF-16's byte-order mark), not UTF-8; save it as UTF-8")
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()  # the newline that ends the last line does not start another
    lines: Lines = []
    problems: list[tuple[int, str]] = []
    for number, chunk in enumerate(raw, start=1):
        where = f"line {number} of {path.name}" if name_file else f"line {number}"
        skip = len(UTF8_BOM) if number == 1 and chunk.startswith(UTF8_BOM) else 0
        try:
            text: str | None = chunk[skip:].decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as err:
            at = skip + err.start  # in the line, as infer --input says it
            problems.append((number, f"{where} is not UTF-8 (byte {chunk[at]:#04x} at offset {at})"))
            text = None
        for char, why in (("\0", NUL), ("\r", LONE_CR)):  # UTF-16 without a BOM; \r-only line ends (one line)
            if text is not None and char in text:
                problems.append((number, f"{where}, character {text.index(char)}: {why}"))
                text = None
        if text is not None and len(text) > MAX_LINE_CHARS:
            problems.append((number, f"{where} has {len(text)} characters, over the limit of {MAX_LINE_CHARS}"))
            text = None
        lines.append((number, text))
    return lines, problems


def _finish(origin: str, sources: list[str], targets: list[str], problems: list[tuple[int, str]],
            expected: str) -> TextPairs:
    """The pairs, or one DataError listing every bad line in line order."""
    if problems:
        raise DataError(listing(origin, [p for _, p in sorted(problems)], expected))
    if not sources:
        raise DataError(f"{origin}: holds no pairs (blank lines are skipped); {expected}")
    return TextPairs(sources, targets, origin)


def load_tsv(path: str | Path) -> TextPairs:
    """Pairs from `source<TAB>target` lines; blank lines skipped, each side stripped of surrounding spaces."""
    path = Path(path)
    lines, problems = _read_lines(path)
    sources, targets = [], []
    for number, line in lines:
        if line is None or not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            problems.append((number, f"line {number} has {len(parts) - 1} tabs, expected exactly 1"))
            continue
        source, target = (p.strip() for p in parts)
        bad = [f"{side} {why}" for side, text in (("source", source), ("target", target))
               if (why := text_problem(text))]
        if bad:
            problems.append((number, f"line {number}: {' and '.join(bad)}"))
            continue
        sources.append(source)
        targets.append(target)
    return _finish(str(path), sources, targets, problems, f"expected UTF-8 lines 'source<TAB>target' of at most "
                                                          f"{MAX_LINE_CHARS} characters")


def load_parallel(source_path: str | Path, target_path: str | Path) -> TextPairs:
    """Pairs from two line-aligned files; lines blank in both are skipped, a side blank in one is an error."""
    paths = (Path(source_path), Path(target_path))
    (source_lines, source_problems), (target_lines, target_problems) = (_read_lines(p, True) for p in paths)
    origin = f"{paths[0]},{paths[1]}"
    source_lines, target_lines = _without_trailing_blanks(source_lines), _without_trailing_blanks(target_lines)
    if len(source_lines) != len(target_lines) and source_problems + target_problems:  # a \r-only file is one line
        raise DataError(listing(origin, [p for _, p in sorted(source_problems + target_problems)],
                                f"expected UTF-8 lines of at most {MAX_LINE_CHARS} characters"))
    if len(source_lines) != len(target_lines):
        raise DataError(f"{origin}: parallel files must have the same number of lines; {paths[0]} has "
                        f"{len(source_lines)}, {paths[1]} has {len(target_lines)}; line i of one must translate "
                        "line i of the other")
    problems = source_problems + target_problems
    sources, targets = [], []
    for (number, source), (_, target) in zip(source_lines, target_lines):
        if source is None or target is None or not (source.strip() or target.strip()):
            continue
        bad = [f"{side} {why}" for side, text in (("source", source), ("target", target))
               if (why := text_problem(text.strip()))]
        if bad:
            problems.append((number, f"line {number}: {' and '.join(bad)}"))
            continue
        sources.append(source.strip())
        targets.append(target.strip())
    expected = f"expected UTF-8 lines of at most {MAX_LINE_CHARS} characters, line i of each file a pair"
    return _finish(origin, sources, targets, problems, expected)


def _without_trailing_blanks(lines: Lines) -> Lines:
    """`lines` less the blank ones at its end: an editor's extra newlines do not misalign two parallel files."""
    end = len(lines)
    while end and lines[end - 1][1] is not None and not lines[end - 1][1].strip():
        end -= 1
    return lines[:end]


def text_holdout_split(pairs: TextPairs) -> tuple[TextPairs, TextPairs]:
    """Deterministic split as for point data: a SPLIT_SEED permutation, HOLDOUT_FRACTION (at least one) held out."""
    if len(pairs) < 2:
        raise DataError(f"{pairs.origin}: holds {len(pairs)} pair; at least 2 are needed "
                        f"to hold out {HOLDOUT_FRACTION:.0%} as a test set")
    n_test = max(1, round(len(pairs) * HOLDOUT_FRACTION))
    order = np.random.default_rng(SPLIT_SEED).permutation(len(pairs))
    return pairs.subset(np.sort(order[n_test:])), pairs.subset(np.sort(order[:n_test]))


DataSource = str | Path | tuple[str | Path, str | Path]


def _resolve(name_or_path: DataSource) -> tuple[str, Any]:
    """(kind, what): a built-in name, a TSV path, or a (source, target) pair of paths."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_LOADERS:
        return name_or_path, name_or_path
    if isinstance(name_or_path, tuple) and len(name_or_path) == 2:
        return PARALLEL, tuple(Path(p) for p in name_or_path)
    if isinstance(name_or_path, str) and PAIR_SEPARATOR in name_or_path and not Path(name_or_path).is_file():
        parts = name_or_path.split(PAIR_SEPARATOR)
        if len(parts) == 2 and all(p.strip() for p in parts):
            return PARALLEL, tuple(Path(p.strip()) for p in parts)
    if isinstance(name_or_path, (str, Path)) and Path(name_or_path).suffix.lower() == TSV_SUFFIX:
        return TSV, Path(name_or_path)
    raise DataError(f"text data {str(name_or_path)!r} is neither a built-in data set {sorted(BUILTIN_LOADERS)}, "
                    f"a {TSV_SUFFIX} file, nor two line-aligned files 'SRC_PATH{PAIR_SEPARATOR}TGT_PATH'")


def load_text_dataset(name_or_path: DataSource) -> tuple[TextPairs, TextPairs]:
    """A built-in name -> its (train, test); a .tsv or 'SRC,TGT' files -> (train, held-out test)."""
    kind, what = _resolve(name_or_path)
    if kind in BUILTIN_LOADERS:
        return BUILTIN_LOADERS[kind]()
    return text_holdout_split(load_tsv(what) if kind == TSV else load_parallel(*what))


def describe_text_dataset(name_or_path: DataSource, train: TextPairs, test: TextPairs) -> dict[str, Any]:
    """Plain-JSON description of where the text came from, enough to reload and verify it."""
    kind, what = _resolve(name_or_path)
    sizes = {"n_train": len(train), "n_test": len(test)}
    if kind in BUILTIN_LOADERS:
        return {"name": kind, **copy.deepcopy(BUILTIN_PARAMS[kind]), **sizes}
    split = {"holdout_fraction": HOLDOUT_FRACTION, "split_seed": SPLIT_SEED, **sizes}
    if kind == TSV:
        return {"name": TSV, "path": str(what.resolve()), "sha256": sha256_file(what), **split}
    source, target = (p.resolve() for p in what)
    return {"name": PARALLEL, "source_path": str(source), "source_sha256": sha256_file(source),
            "target_path": str(target), "target_sha256": sha256_file(target), **split}


def reload_text_dataset(description: dict[str, Any]) -> tuple[TextPairs, TextPairs]:
    """Load the text a description names, refusing files that changed since it was described."""
    name = description.get("name")
    source: Any = {TSV: description.get("path"),
                   PARALLEL: (description.get("source_path"), description.get("target_path"))}.get(name, name)
    if not isinstance(source, str) and not (isinstance(source, tuple) and all(isinstance(p, str) for p in source)):
        raise DataError(f"text data description {description!r} names neither a built-in data set nor its files")
    return reload_unchanged(source, description, load_text_dataset, describe_text_dataset)
