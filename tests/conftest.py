"""Shared fixtures: tiny seeded models of each attention kind, exported once per session. Shared helpers that are
not fixtures live in tests/support/."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from support.models import KINDS, Exported, make_model


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
    from training.tokens.data import toy_translation
    from training.tokens.transformer import TransformerSeq2Seq

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start Ray or torchrun are slow too: `-m "not slow"` leaves them out."""
    for item in items:
        if item.get_closest_marker("ray") or item.get_closest_marker("ddp"):
            item.add_marker(pytest.mark.slow)


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
