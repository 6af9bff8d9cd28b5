"""Shared fixtures: tiny seeded models of each attention kind, exported once per session. Shared helpers that are
not fixtures live in tests/support/."""
from __future__ import annotations

import os
import sys
from typing import Iterator

# Every process the tests start trains, exports or runs tiny models, fastest on one thread. And with two pytest-xdist
# workers on a 2-core machine, two OpenMP threads a process spin-wait on each other: a one-process training of 5 s
# took 84 s. Set before torch is imported here; the processes the tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from support.models import KINDS, Exported, TokenExport, export_token_model, make_model, toy_token_spec


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


@pytest.fixture(scope="session")
def transformer_export(tmp_path_factory) -> TokenExport:
    """A seeded, untrained 2-layer transformer on the toy corpus's vocabularies, exported once (parity checked)
    with a position table of TRANSFORMER_MAX_POSITIONS rows."""
    spec = toy_token_spec(arch="transformer", d_model=8, d_ff=16, n_heads=2, layers=2,
                          max_positions=TRANSFORMER_MAX_POSITIONS)
    return export_token_model(spec, tmp_path_factory.mktemp("transformer") / "model")


@pytest.fixture(scope="session")
def recurrent_export(tmp_path_factory) -> TokenExport:
    """A seeded, untrained bidirectional GRU with additive attention on the toy corpus's vocabularies, exported once
    (parity checked)."""
    spec = toy_token_spec(cell="gru", bidirectional=True, attention="additive", hidden_dim=8, embedding_dim=6)
    return export_token_model(spec, tmp_path_factory.mktemp("recurrent") / "model")


CLUSTERS = "clusters"  # the xdist_group of every test that starts Ray or torchrun
UNGROUPED = pytest.StashKey[str]()  # why this worker's grouped tests fail, where pytest-xdist did not group them


@pytest.hookimpl(wrapper=True)  # marks before pytest-xdist's own hook reads them, and a check after it has
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Tests that start Ray or torchrun are slow too: `-m "not slow"` leaves them out. Under pytest-xdist
    (`--dist loadgroup`) they all run on one worker, one after another: two clusters at once on two cores would
    starve each other's start-up and signal timings; the other tests spread over both workers. pytest-xdist groups
    them by a suffix of their node ids; from pytest 9.2 that suffix no longer takes (pytest-xdist issue #1386) and
    the group was silently ignored: such a session's grouped tests fail, saying so (`pytest_runtest_setup`)."""
    for item in items:
        if item.get_closest_marker("ray") or item.get_closest_marker("ddp"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group(CLUSTERS))
    result = yield
    grouped = [item for item in items if item.get_closest_marker("xdist_group")]
    if getattr(config.option, "loadgroup", False) and not all(i.nodeid.endswith("@" + CLUSTERS) for i in grouped):
        config.stash[UNGROUPED] = (
            f"pytest-xdist's --dist loadgroup did not group the tests that start Ray or torchrun (their node ids "
            f"lack '@{CLUSTERS}'), so two clusters would run at once on two workers; pytest {pytest.__version__} "
            "keeps node ids in a way pytest-xdist cannot suffix (its issue #1386): install the pinned test tools "
            "(pip install -e '.[test]'), or run these tests with -n 0")
    return result


def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.config.stash and item.get_closest_marker("xdist_group"):
        pytest.fail(item.config.stash[UNGROUPED], pytrace=False)


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
