"""Shared fixtures: tiny seeded models of each attention kind, exported once per session."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnxruntime as ort
import pytest

KINDS = {"none": 1, "dot": 1, "multihead": 3}
HIDDEN = 5


def cuda_really_works() -> bool:
    """True only when a session asked for CUDA reports it in get_providers()."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    except Exception:
        return False
    return "CUDAExecutionProvider" in session.get_providers()


DEVICES = ["cpu"] + (["cuda"] if cuda_really_works() else [])


@dataclass
class Exported:
    """A seeded model, its spec and the directory it was exported to."""

    kind: str
    model: object
    spec: object
    path: Path


def make_model(kind: str, seed: int = 0):
    """A small seeded model of the given attention kind."""
    import torch

    from runtime.spec import ModelSpec
    from training.build import build_model

    torch.manual_seed(seed)
    spec = ModelSpec(n_features=2, hidden_dim=HIDDEN, attention=kind, n_heads=KINDS[kind])
    return build_model(spec).eval(), spec


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Exported]:
    """One export per attention kind, shared by the whole session."""
    from export.api import export_model

    root = tmp_path_factory.mktemp("exports")
    out = {}
    for kind in KINDS:
        model, spec = make_model(kind)
        out[kind] = Exported(kind, model, spec, export_model(model, root / kind))
    return out


@pytest.fixture(params=list(KINDS))
def exported(request, exports) -> Exported:
    """Each export in turn."""
    return exports[request.param]


TRANSFORMER_MAX_POSITIONS = 8  # small, so the runtime's position-table refusals are cheap to reach


@dataclass
class TokenExport:
    """A seeded token model, its (source, target) vocabularies and the directory it was exported to."""

    model: object
    source: object
    target: object
    path: Path


@pytest.fixture(scope="session")
def transformer_export(tmp_path_factory) -> TokenExport:
    """A seeded, untrained 2-layer transformer on the toy corpus's vocabularies, exported once (parity checked)
    with a position table of TRANSFORMER_MAX_POSITIONS rows."""
    import torch

    from export.api import export_model
    from runtime.spec import ModelSpec
    from runtime.vocab import Vocabulary
    from training.text_data import toy_translation
    from training.transformer import TransformerSeq2Seq

    pairs, _ = toy_translation()
    source = Vocabulary.build(pairs.sources, "whitespace")
    target = Vocabulary.build(pairs.targets, "whitespace")
    spec = ModelSpec(kind="tokens", arch="transformer", d_model=8, d_ff=16, n_heads=2, layers=2, target_len=6,
                     source_vocab_size=len(source), target_vocab_size=len(target),
                     max_positions=TRANSFORMER_MAX_POSITIONS)
    torch.manual_seed(0)
    model = TransformerSeq2Seq(spec).eval()
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread, which a session fixture cannot use: tiny models run fastest so
    try:
        path = export_model(model, tmp_path_factory.mktemp("transformer") / "model", vocabularies=(source, target))
    finally:
        torch.set_num_threads(before)
    return TokenExport(model, source, target, path)


def source_batch(n: int, length: int, seed: int = 1, features: int = 2) -> np.ndarray:
    """Deterministic float32 sources (N, L, F)."""
    return np.random.default_rng(seed).normal(size=(n, length, features)).astype(np.float32)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and a shared 2-core machine stays usable."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def python() -> str:
    """The interpreter running the tests (so subprocesses see the same install)."""
    return sys.executable


def _default_sigint() -> None:
    import signal

    # A shell that starts jobs in the background ignores SIGINT for them, and children inherit that;
    # the tests send SIGINT on purpose, so the child gets the default handler back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def child_process(args: list[str], **kwargs: object) -> Iterator[subprocess.Popen]:
    """Popen that receives SIGINT whatever the test runner inherited, and is killed if the test leaves it running."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
