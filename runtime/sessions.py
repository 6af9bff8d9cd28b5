"""onnxruntime sessions: provider choice that tells the truth, and graph I/O checks."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort

from .errors import IntegrityError, ProviderError
from .manifest import sha256_bytes

PROVIDERS = ("auto", "cpu", "cuda")
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def requested_providers(provider: str) -> list[str]:
    """Translate 'auto' | 'cpu' | 'cuda' into an onnxruntime provider list."""
    if provider not in PROVIDERS:
        raise ProviderError(f"provider: expected one of {PROVIDERS}, got {provider!r}")
    available = ort.get_available_providers()
    if provider == "cpu":
        return [CPU]
    if provider == "cuda" and CUDA not in available:
        raise ProviderError(
            f"provider 'cuda': this onnxruntime build ({ort.__version__}, providers {available}) has no CUDA "
            "support; install seq2onnx[gpu] (onnxruntime-gpu) instead of seq2onnx[cpu], or pass provider 'cpu'"
        )
    return [CUDA, CPU] if CUDA in available else [CPU]


def read_graph(model_dir: Path, file_name: str, expected_sha: str) -> bytes:
    """Read a graph's bytes and check them against the manifest's sha256 before any parsing."""
    path = Path(model_dir) / file_name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(f"{path}: graph file listed in the manifest is missing; re-export the model") from None
    actual = sha256_bytes(data)
    if actual != expected_sha:
        raise IntegrityError(
            f"{path}: sha256 {actual[:16]}... does not match the manifest's {expected_sha[:16]}...; "
            "the file was altered or truncated, re-export the model"
        )
    return data


def open_session(data: bytes, provider: str, threads: int | None, name: str) -> ort.InferenceSession:
    """Create a session; a 'cuda' request that silently fell back to CPU is an error."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3  # keep fallback warnings out of services' logs; we check ourselves
    providers = requested_providers(provider)
    try:
        session = ort.InferenceSession(data, sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        if CUDA in providers:
            raise ProviderError(f"{name}: onnxruntime could not start a session with {providers} ({exc})") from None
        raise IntegrityError(f"{name}: onnxruntime could not load the graph ({exc})") from None
    if provider == "cuda" and CUDA not in session.get_providers():
        raise ProviderError(
            f"provider 'cuda': onnxruntime-gpu is installed but CUDA could not start (no NVIDIA GPU, driver, "
            f"CUDA or cuDNN libraries); the session fell back to {session.get_providers()}. Pass provider 'cpu' or 'auto'"
        )
    return session


def session_io(session: ort.InferenceSession) -> dict[str, dict[str, list[Any]]]:
    """A session's inputs and outputs as {name: dims}, in the manifest's format."""
    def dims(args: list[Any]) -> dict[str, list[Any]]:
        return {a.name: list(a.shape) for a in args}

    return {"inputs": dims(session.get_inputs()), "outputs": dims(session.get_outputs())}
