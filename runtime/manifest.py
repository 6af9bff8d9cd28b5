"""Read and check manifest.json; hash graph files. The writer lives in `export.manifest`."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import MANIFEST_FILE, SUPPORTED_FORMAT_VERSIONS, graph_io
from .errors import ManifestError
from .spec import ModelSpec, SpecError


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's contents, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest: spec, per-graph file/hash/I-O, export id and the raw dict."""

    spec: ModelSpec
    graphs: dict[str, dict[str, Any]]
    export_id: str
    raw: dict[str, Any]


def read_manifest(model_dir: Path) -> Manifest:
    """Load `model_dir/manifest.json`, refusing unknown versions and malformed content."""
    path = Path(model_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{path}: no manifest found; expected a directory written by `seq2onnx export`")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    version = raw.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ManifestError(
            f"{path}: format_version {version!r} is not understood by this runtime; "
            f"understood versions: {list(SUPPORTED_FORMAT_VERSIONS)} (upgrade seq2onnx or re-export the model)"
        )
    try:
        spec = ModelSpec.from_dict(raw.get("spec"))
    except SpecError as exc:
        raise ManifestError(f"{path}: {exc}") from None
    graphs, export_id = raw.get("graphs"), raw.get("export_id")
    expected = graph_io(spec)
    if not isinstance(graphs, dict) or sorted(graphs) != sorted(expected):
        got = sorted(graphs) if isinstance(graphs, dict) else graphs
        raise ManifestError(f"{path}: 'graphs' must list {sorted(expected)}, got {got!r}")
    for name, entry in graphs.items():
        declared = {"inputs": entry.get("inputs"), "outputs": entry.get("outputs")} if isinstance(entry, dict) else None
        if declared != expected[name] or not isinstance(entry.get("sha256"), str):
            raise ManifestError(f"{path}: entry for {name!r} does not match the spec's graph I/O or lacks a sha256")
    if not isinstance(export_id, str) or not export_id:
        raise ManifestError(f"{path}: 'export_id' must be a non-empty string, got {export_id!r}")
    return Manifest(spec=spec, graphs=graphs, export_id=export_id, raw=raw)
