"""Read and check manifest.json. The writer lives in `export.manifest`; hashes and bounded reads in `model_files`."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import (
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_WEIGHTS_FILE,
    CONTRACT_SINCE,
    GREEDY_FILE,
    MANIFEST_FILE,
    SUPPORTED_FORMAT_VERSIONS,
    VOCAB_FILES,
    graph_io,
)
from .declared import ContractError, TokenContract
from .defaults import FP32
from .errors import ManifestError, brief
from .model_files import read_regular_file
from .optional_graphs import optional_graph_io
from .spec import ModelSpec, SpecError

MAX_MANIFEST_BYTES = 16 << 20  # 16 MiB: ours are a few KiB, parity report included; more is not a manifest
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest: spec, per-graph file/hash/I-O, export id and the raw dict."""

    spec: ModelSpec
    graphs: dict[str, dict[str, Any]]
    export_id: str
    raw: dict[str, Any]
    vocabularies: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # token models: side -> entry
    contract: TokenContract | None = None  # token models: what the graphs take and give (runtime.declared)

    @property
    def precision(self) -> str:
        """The export's weights: 'fp32', or 'int8' / 'fp16' where the manifest records a conversion."""
        entry = self.raw.get("precision")
        return entry.get("weights", FP32) if isinstance(entry, dict) else FP32


def read_manifest(model_dir: Path) -> Manifest:
    """Load `model_dir/manifest.json`, refusing unknown versions and malformed content (every field read is checked)."""
    path = Path(model_dir) / MANIFEST_FILE
    raw = _load_json(path)
    if "format_version" not in raw:
        raise ManifestError(f"{path}: has no format_version (every seq2onnx manifest has one); this is not a "
                            "seq2onnx export, or its manifest was edited: re-export the model")
    version = raw["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):  # "2" read as a version said it was not understood
        raise ManifestError(f"{path}: format_version must be an integer, got {type(version).__name__} "
                            f"{brief(version)}; the manifest was edited: re-export the model")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ManifestError(
            f"{path}: format_version {brief(version)} is not understood by this runtime; "
            f"understood versions: {list(SUPPORTED_FORMAT_VERSIONS)} (upgrade seq2onnx or re-export the model)"
        )
    try:
        spec = ModelSpec.from_dict(raw.get("spec"))
    except SpecError as exc:
        raise ManifestError(f"{path}: {exc}; re-export the model") from None
    contract = _read_contract(path, raw, version, spec)
    graphs = _read_graphs(path, raw.get("graphs"), spec, contract)
    export_id = raw.get("export_id")
    if not isinstance(export_id, str) or not export_id:
        raise ManifestError(
            f"{path}: 'export_id' must be a non-empty string, got {brief(export_id)}; re-export the model"
        )
    vocabularies = _read_vocabularies(path, raw.get("vocabularies"), spec)
    return Manifest(spec=spec, graphs=graphs, export_id=export_id, raw=raw, vocabularies=vocabularies,
                    contract=contract)


def _read_contract(path: Path, raw: dict[str, Any], version: int, spec: ModelSpec) -> TokenContract | None:
    """A token model's contract: the manifest's own (format 2), or its spec's (format 1, which predates it). One of
    seq2onnx's own models must carry exactly its spec's; a declared model's is checked on its own."""
    if spec.kind != "tokens":
        if "contract" in raw:
            raise ManifestError(f"{path}: a point model's manifest has no 'contract'; re-export the model")
        return None
    if version < CONTRACT_SINCE:
        if spec.is_declared:
            raise ManifestError(f"{path}: a declared model needs format_version {CONTRACT_SINCE} or later, got "
                                f"{version}; re-export the model")
        return TokenContract.for_spec(spec)
    try:
        contract = TokenContract.from_dict(raw.get("contract"))
    except ContractError as exc:
        raise ManifestError(f"{path}: 'contract': {exc}; re-export the model") from None
    if not spec.is_declared and contract != (implied := TokenContract.for_spec(spec)):
        edited = [f.name for f in dataclasses.fields(TokenContract)
                  if getattr(contract, f.name) != getattr(implied, f.name)]
        raise ManifestError(f"{path}: 'contract' differs from the one the spec implies in {', '.join(edited)}; the "
                            "spec or the contract was edited, re-export the model")
    if contract.target_vocab_size != spec.target_vocab_size:
        raise ManifestError(f"{path}: 'contract' decodes {contract.target_vocab_size} target ids, the spec's "
                            f"target_vocab_size is {spec.target_vocab_size}; re-export the model")
    return contract


def _read_vocabularies(path: Path, entries: Any, spec: ModelSpec) -> dict[str, dict[str, str]]:
    """Token models list each side's vocabulary file and sha256; point models list none."""
    if spec.kind != "tokens":
        return {}
    if not isinstance(entries, dict) or sorted(entries) != sorted(VOCAB_FILES):
        raise ManifestError(f"{path}: 'vocabularies' must list {sorted(VOCAB_FILES)} for a token model, "
                            f"got {brief(entries)}; re-export the model")
    out = {}
    for side, name in VOCAB_FILES.items():
        entry = entries[side]
        if not isinstance(entry, dict):
            raise ManifestError(f"{path}: vocabularies[{side!r}] must be a JSON object, got {brief(entry)}")
        _check_file(path, name, entry.get("file"), f"vocabularies[{side!r}]")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise ManifestError(f"{path}: vocabularies[{side!r}]['sha256'] must be 64 lowercase hex digits, "
                                f"got {brief(sha)}; re-export the model")
        out[side] = {"file": name, "sha256": sha}
    return out


def _no_manifest(path: Path) -> str:
    """Why `path` (a model directory's manifest) is missing, naming the directory; a training checkpoint is told to
    be exported first."""
    folder = path.parent.absolute()
    if not folder.exists():
        return f"the model directory {folder} does not exist; expected a directory written by `seq2onnx export`"
    if not folder.is_dir():
        return f"{folder} is not a directory; expected a directory written by `seq2onnx export`"
    if (folder / CHECKPOINT_SPEC_FILE).is_file() and (folder / CHECKPOINT_WEIGHTS_FILE).is_file():
        return (f"no manifest found: {folder} is a training checkpoint, not an export; export it first (seq2onnx "
                f"export {folder} --out EXPORT_DIR) and pass EXPORT_DIR")
    return f"no manifest found in {folder}; expected a directory written by `seq2onnx export`"


def _load_json(path: Path) -> dict[str, Any]:
    """The manifest's top-level JSON object."""
    data = read_regular_file(path, MAX_MANIFEST_BYTES, ManifestError, lambda: _no_manifest(path))
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # ValueError: bad JSON, or an int of more than 4300 digits
        raise ManifestError(f"{path}: not valid JSON ({exc}); re-export the model") from None
    except RecursionError:
        raise ManifestError(f"{path}: not a manifest (JSON nested too deeply to read); re-export the model") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(raw).__name__}; re-export the model")
    return raw


def _read_graphs(path: Path, graphs: Any, spec: ModelSpec,
                 contract: TokenContract | None) -> dict[str, dict[str, Any]]:
    """Check each graph entry against what the spec (a declared model: its contract) implies; return them rebuilt
    from checked values. The step-loop graphs are required; the greedy loop is optional (exports before it still
    load)."""
    if spec.is_declared and contract is not None:
        required, optional = contract.graph_io(), {GREEDY_FILE: contract.greedy_io()}
    else:
        required, optional = graph_io(spec), optional_graph_io(spec)
    allowed = {**required, **optional}
    if not isinstance(graphs, dict) or not set(required) <= set(graphs) <= set(allowed):
        got = sorted(graphs) if isinstance(graphs, dict) else graphs
        raise ManifestError(f"{path}: 'graphs' must list {sorted(required)} and may list {sorted(optional)}, got "
                            f"{brief(got)}; re-export the model")
    out = {}
    for name, io in allowed.items():
        if name not in graphs:
            continue
        entry = graphs[name]
        if not isinstance(entry, dict):
            raise ManifestError(
                f"{path}: graphs[{name!r}] must be a JSON object, got {brief(entry)}; re-export the model"
            )
        _check_file(path, name, entry.get("file"), f"graphs[{name!r}]")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise ManifestError(f"{path}: graphs[{name!r}]['sha256'] must be 64 lowercase hex digits, "
                                f"got {brief(sha)}; re-export the model")
        for kind in ("inputs", "outputs"):
            _check_io(path, name, kind, entry.get(kind), io[kind], spec)
        out[name] = {"file": name, "sha256": sha, **io}
    return out


def _check_file(path: Path, name: str, file: Any, where: str) -> None:
    """An entry's file must be its graph's own plain name: nothing outside the model directory is ever read."""
    if isinstance(file, str) and file == name:
        return
    if not isinstance(file, str):
        reason = "is not a string"
    elif os.path.isabs(file) or file.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", file):
        reason = "is an absolute path"
    elif ".." in file:
        reason = "contains '..'"
    elif "/" in file or "\\" in file:
        reason = "contains a path separator"
    else:
        reason = "is another file than this entry's"
    raise ManifestError(
        f"{path}: {where}['file'] is {brief(file)}, which {reason}; expected {name!r}, a plain file name "
        "inside the model directory (files elsewhere are never read); re-export the model"
    )


def _check_io(path: Path, graph: str, kind: str, declared: Any, implied: dict[str, list[Any]], spec: ModelSpec) -> None:
    """Declared input/output names and dims must be exactly those the spec implies (types too: 1, not true or 1.0)."""
    if not isinstance(declared, dict) or sorted(declared) != sorted(implied):
        got = sorted(declared) if isinstance(declared, dict) else declared
        raise ManifestError(
            f"{path}: {graph} {kind}: manifest declares {brief(got)}, the spec implies {sorted(implied)}; "
            "the spec or the entry was edited, re-export the model"
        )
    for io_name, dims in implied.items():
        given = declared[io_name]
        if not _same_dims(given, dims):
            raise ManifestError(
                f"{path}: {graph} {kind[:-1]} {io_name!r}: manifest declares {brief(given)}, the spec"
                f"{_fields_behind(spec, dims, given)} implies {dims}; the spec or the entry was edited, "
                "re-export the model"
            )


def _same_dims(given: Any, dims: list[Any]) -> bool:
    """Equal lists with equal element types (JSON true == 1 == 1.0 in Python; not here)."""
    return isinstance(given, list) and len(given) == len(dims) and all(
        type(g) is type(d) and g == d for g, d in zip(given, dims))


def _fields_behind(spec: ModelSpec, dims: list[Any], given: Any) -> str:
    """' (hidden_dim=6)': the spec fields whose values are the implied sizes the manifest got wrong."""
    given = given if isinstance(given, list) and len(given) == len(dims) else [None] * len(dims)
    wrong = {d for d, g in zip(dims, given) if isinstance(d, int) and not (type(g) is int and g == d)}
    fields = [f"{k}={v}" for k, v in spec.to_dict().items() if type(v) is int and v in wrong]
    return f" ({', '.join(fields)})" if fields else ""
