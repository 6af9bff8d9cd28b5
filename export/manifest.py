"""Write manifest.json: format version, spec, graphs with hashes and I/O, opset, producers, parity."""
from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from runtime.contract import FORMAT_VERSION, GREEDY_FILE, MANIFEST_FILE, VOCAB_FILES, graph_io
from runtime.declared import TokenContract
from runtime.model_files import sha256_file
from runtime.optional_graphs import optional_graph_io
from runtime.spec import ModelSpec


def producer_versions() -> dict[str, str]:
    """Versions of everything that shaped the graphs."""
    out = {"python": platform.python_version()}
    for dist in ("seq2onnx", "torch", "onnx", "onnxruntime", "onnxruntime-gpu", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def build_manifest(model_dir: Path, spec: ModelSpec, export_id: str, opset: int,
                   parity: dict[str, Any] | None, source: str,
                   contract: TokenContract | None = None) -> dict[str, Any]:
    """The manifest for the graphs (the optional ones that exist: the greedy loop) and, for token models, the
    vocabularies now in model_dir and the contract (a declared model's own, else the one its spec implies)."""
    if spec.kind == "tokens" and contract is None:
        contract = TokenContract.for_spec(spec)
    if spec.is_declared:
        required, optional = contract.graph_io(), {GREEDY_FILE: contract.greedy_io()}
    else:
        required, optional = graph_io(spec), optional_graph_io(spec)
    present = {name: io for name, io in optional.items() if (model_dir / name).exists()}
    graphs = {
        name: {"file": name, "sha256": sha256_file(model_dir / name), **io}
        for name, io in {**required, **present}.items()
    }
    vocabularies = {} if spec.kind != "tokens" else {
        side: {"file": name, "sha256": sha256_file(model_dir / name)} for side, name in VOCAB_FILES.items()}
    return {
        **({"vocabularies": vocabularies} if vocabularies else {}),
        "format_version": FORMAT_VERSION,
        "export_id": export_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "spec": spec.to_dict(),
        "graphs": graphs,
        "opset": opset,
        "producer": producer_versions(),
        "parity": parity,
        **({"contract": contract.to_dict()} if contract is not None else {}),
    }


def write_manifest(model_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write manifest.json (indent 2, sorted keys)."""
    path = model_dir / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
