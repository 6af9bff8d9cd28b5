"""A Ctrl-C that lands just after a command has put its directory in place (while the old tree is removed, or the
lock let go) says the output was written, and leaves it whole: it used to say that nothing was written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import default_stops

# The program, with a Ctrl-C sent to itself at the first removal runtime.atomic makes once a tree is published
# (the staging name, or the old tree swapped under it): the moment a real Ctrl-C can land there.
AFTER_PUBLISH = """
import os, signal, sys
from runtime import atomic
real = atomic.remove
def remove(path):
    if not remove.sent:
        remove.sent = True
        os.kill(os.getpid(), signal.SIGINT)
    real(path)
remove.sent = False
atomic.remove = remove
from cli.main import entry
sys.argv[0] = 'seq2onnx'
entry()
"""


def _run(cwd: Path, *args: str, stop: bool = False) -> subprocess.CompletedProcess:
    prefix = [sys.executable, "-c", AFTER_PUBLISH] if stop else [sys.executable, "-m", "cli"]
    return subprocess.run([*prefix, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          preexec_fn=default_stops)  # Ctrl-C as from a terminal, though pytest ran in the background


def _train(cwd: Path, out: str, stop: bool = False) -> subprocess.CompletedProcess:
    return _run(cwd, "train", "--epochs", "1", "--hidden-dim", "4", "--quiet", "--threads", "1", "--out", out,
                stop=stop)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("after_publish")
    assert _train(root, "ckpt").returncode == 0
    return root / "ckpt"


@pytest.mark.parametrize("replacing", [False, True], ids=["new", "force"])
def test_an_export_stopped_once_published_says_it_was_written(checkpoint: Path, tmp_path: Path,
                                                              replacing: bool) -> None:
    old = None
    if replacing:
        assert _run(tmp_path, "export", str(checkpoint), "--out", "model").returncode == 0
        old = json.loads((tmp_path / "model" / "manifest.json").read_text())["export_id"]
    done = _run(tmp_path, "export", str(checkpoint), "--out", "model", *(["--force"] if replacing else []),
                stop=True)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "Error: export: interrupted; it had written model, and nothing else"
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["export_id"] != old and "parity" in manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staged or old tree, no lock left
    assert _run(tmp_path, "verify", str(checkpoint), "model").returncode == 0


def test_a_training_stopped_once_its_checkpoint_is_written_says_so(tmp_path: Path) -> None:
    done = _train(tmp_path, "ckpt", stop=True)
    assert done.returncode == 130, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"Error: train: interrupted just after {str(tmp_path / 'ckpt')!r} was written; the run is complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # its interrupted-run state gone too
    assert _run(tmp_path, "export", "ckpt", "--out", "model").returncode == 0
