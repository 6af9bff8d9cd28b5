"""The checks a graph's session must pass as `Seq2Seq.load` opens it: the manifest's I/O, this export's id, the
manifest's spec."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .contract import EXPORT_ID_KEY, SPEC_KEY
from .errors import IntegrityError, brief
from .manifest import Manifest
from .sessions import session_io
from .spec import ModelSpec

IO_DIFFERENCES = 3  # of the I/O differences a message lists


def check_session(session: Any, entry: dict[str, Any], manifest: Manifest, where: Path) -> None:
    """The graph's I/O must be the manifest's, and it must carry this export's id and spec."""
    actual = session_io(session)
    declared = {"inputs": entry["inputs"], "outputs": entry["outputs"]}
    if actual != declared:
        raise IntegrityError(f"{where}: the graph's inputs and outputs do not match the manifest's "
                             f"({_io_difference(actual, declared)}); the file is not the graph the manifest names, "
                             "re-export the model")
    metadata = session.get_modelmeta().custom_metadata_map
    graph_id = metadata.get(EXPORT_ID_KEY)
    if graph_id != manifest.export_id:
        raise IntegrityError(
            f"{where}: graph belongs to export {brief(graph_id)}, the manifest to {manifest.export_id!r}; "
            "the directory mixes files from different exports, re-export the model"
        )
    _graph_spec(metadata.get(SPEC_KEY), manifest, where)


def _io_difference(actual: dict[str, dict[str, Any]], declared: dict[str, dict[str, Any]]) -> str:
    """What differs, name by name: missing, extra, or dims (the first few), not both whole dicts."""
    said = []
    for side in ("inputs", "outputs"):
        have, want = actual.get(side, {}), declared.get(side, {})
        said += [f"{side[:-1]} {name!r} missing" for name in want if name not in have]
        said += [f"{side[:-1]} {name!r} not declared" for name in have if name not in want]
        said += [f"{side[:-1]} {name!r} is {have[name]}, declared {want[name]}" for name in want
                 if name in have and have[name] != want[name]]
    shown = "; ".join(said[:IO_DIFFERENCES])
    return shown + (f"; and {len(said) - IO_DIFFERENCES} more" if len(said) > IO_DIFFERENCES else "")


def _graph_spec(text: str | None, manifest: Manifest, where: Path) -> None:
    """The spec the graph was exported with must be the manifest's (target_len, say, changes no I/O)."""
    try:
        graph_spec = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        graph_spec = None
    if not isinstance(graph_spec, dict):
        raise IntegrityError(f"{where}: graph metadata has no readable {SPEC_KEY!r}; re-export the model")
    spec = manifest.spec.to_dict()
    differ = sorted(k for k in spec.keys() | graph_spec.keys()  # a value or its JSON type: 1 is not 1.0 or true
                    if type(graph_spec.get(k)) is not type(spec.get(k)) or graph_spec.get(k) != spec.get(k))
    if differ:
        shown = {f.name: f.default for f in dataclasses.fields(ModelSpec)}  # a field left out holds its default
        pairs = ", ".join(f"{k}: graph {brief(graph_spec.get(k, shown.get(k)))}, manifest "
                          f"{brief(spec.get(k, shown.get(k)))}" for k in differ)
        raise IntegrityError(
            f"{where}: the manifest's spec differs from the one the graph was exported with ({pairs}); "
            "manifest.json was edited, restore it or re-export the model"
        )
