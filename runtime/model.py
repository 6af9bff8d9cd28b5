"""`Seq2Seq`: a loaded, checked, thread-safe exported model with one `predict` call."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .contract import DECODER_STEP_FILE, ENCODER_FILE, EXPORT_ID_KEY
from .decode import greedy_decode
from .errors import IntegrityError, InputError
from .inputs import check_mask, check_source, check_target_len
from .manifest import Manifest, read_manifest
from .sessions import open_session, read_graph, session_io
from .spec import ModelSpec


class Seq2Seq:
    """An exported encoder + decoder-step pair. Load once, call `predict` from any thread."""

    def __init__(self, manifest: Manifest, sessions: dict[str, Any], path: Path) -> None:
        self.manifest = manifest
        self.path = path
        self._encoder = sessions[ENCODER_FILE]
        self._step = sessions[DECODER_STEP_FILE]
        self._encoder_outputs = list(manifest.graphs[ENCODER_FILE]["outputs"])
        self.step_inputs = list(manifest.graphs[DECODER_STEP_FILE]["inputs"])
        self._step_outputs = list(manifest.graphs[DECODER_STEP_FILE]["outputs"])

    @classmethod
    def load(cls, path: str | Path, provider: str = "auto", threads: int | None = None) -> "Seq2Seq":
        """Load an export directory, verifying version, hashes, graph I/O and export id."""
        path = Path(path)
        manifest = read_manifest(path)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads: expected a positive int or None, got {threads!r}")
        sessions = {}
        for name, entry in manifest.graphs.items():
            data = read_graph(path, name, entry["sha256"])
            session = open_session(data, provider, threads, str(path / name))
            _check_session(session, entry, manifest.export_id, path / name)
            sessions[name] = session
        return cls(manifest, sessions, path)

    @property
    def spec(self) -> ModelSpec:
        """The model's sizes and choices."""
        return self.manifest.spec

    @property
    def providers(self) -> list[str]:
        """Execution providers the sessions actually run on (first is preferred)."""
        return list(self._step.get_providers())

    def predict(
        self, source: Any, target_len: int | None = None, source_mask: Any = None, return_attention: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]:
        """Decode (N, Ls, F) sources -> (N, Lt, F) points [and attention (N, [heads,] Lt, Ls)]."""
        src = check_source(source, self.spec)
        steps = check_target_len(target_len, self.spec)
        mask = check_mask(source_mask, src)
        if src.shape[0] == 0:
            outputs, attention = self._empty(src, steps)
        else:
            outputs, attention = greedy_decode(self.run_encoder, self.run_step, self.step_inputs, src, mask, steps)
        return (outputs, attention) if return_attention else outputs

    def run_encoder(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Graph-level access for parity tools: the encoder graph on a checked-by-caller feed."""
        return dict(zip(self._encoder_outputs, self._encoder.run(self._encoder_outputs, feed)))

    def run_step(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Graph-level access for parity tools: one decoder step on a checked-by-caller feed."""
        return dict(zip(self._step_outputs, self._step.run(self._step_outputs, feed)))

    def _empty(self, src: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Batch 0: the right shapes, nothing run."""
        outputs = np.zeros((0, steps, self.spec.n_features), dtype=np.float32)
        if not self.spec.has_attention:
            return outputs, None
        heads = (self.spec.n_heads,) if self.spec.attention == "multihead" else ()
        return outputs, np.zeros((0, *heads, steps, src.shape[1]), dtype=np.float32)

    def __repr__(self) -> str:
        return f"Seq2Seq(path={str(self.path)!r}, attention={self.spec.attention!r}, providers={self.providers})"



def _check_session(session: Any, entry: dict[str, Any], export_id: str, where: Path) -> None:
    """The graph's I/O must be the manifest's, and it must carry this export's id."""
    actual = session_io(session)
    declared = {"inputs": entry["inputs"], "outputs": entry["outputs"]}
    if actual != declared:
        raise IntegrityError(f"{where}: graph inputs/outputs {actual} do not match the manifest's {declared}")
    graph_id = session.get_modelmeta().custom_metadata_map.get(EXPORT_ID_KEY)
    if graph_id != export_id:
        raise IntegrityError(
            f"{where}: graph belongs to export {graph_id!r}, the manifest to {export_id!r}; "
            "the directory mixes files from different exports, re-export the model"
        )
