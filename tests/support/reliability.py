"""The reliability tables' machinery: a workspace built once per module and copied for each row, the rows
(`Case`), and the checks that a refused command or call names its input, leaves no traceback and changes no file.

Rows run in-process through click's CliRunner (`run_in_process`): a refusal is decided by the command's own code,
which a process of its own would only start more slowly (most of a second, most of it importing torch); the
process is checked to be left as it was (environment, working directory, signal handlers, torch threads). A row
that needs a real process (a signal, a lock held by another process, a torch-free interpreter) says so
(`process=True`) and runs `python -m cli` in a subprocess (`run_cli`)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_MODEL = ROOT / "artifacts" / "squares"
SHIPPED_CHECKPOINT = ROOT / "artifacts" / "squares-checkpoint"
USAGE, BAD_INPUT = 2, 1

# The cases' HOME: onnxruntime writes a telemetry id under ~/.cache on import, which is not ours to judge.
HOME = "home"


def tree_hash(path: Path) -> dict[str, str]:
    """{relative path: sha256 or 'dir'} of everything under `path` but the cases' HOME."""
    out = {}
    for item in sorted(path.rglob("*")):
        rel = str(item.relative_to(path))
        if rel.split(os.sep)[0] == HOME:
            continue
        if item.is_symlink():  # a link is its target's name (a dangling one has no bytes to hash)
            out[rel] = f"link:{os.readlink(item)}"
        else:
            out[rel] = "dir" if item.is_dir() else hashlib.sha256(item.read_bytes()).hexdigest()
    return out


def write(path: Path, data: str | bytes) -> None:
    """Write text or bytes."""
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def npz(path: Path, **arrays: Any) -> None:
    """Write an .npz with these arrays."""
    np.savez(path, **arrays)


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    """Load, change in place and rewrite a JSON file."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def build_template(factory: pytest.TempPathFactory, name: str, setup: Callable[[Path], None]) -> Path:
    """A workspace built once per module by `setup`; each case gets its own copy."""
    path = factory.mktemp(name) / "template"
    path.mkdir()
    setup(path)
    return path


def copy_workspace(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the workspace inside a parent directory of its own (some cases aim at `..`), with the
    cases' HOME beside it."""
    case_dir = tmp_path / "work"
    shutil.copytree(template, case_dir, symlinks=True)
    (tmp_path / HOME).mkdir()
    return case_dir


def workspace_fixtures(name: str, setup: Callable[[Path], None]) -> tuple[Any, Any]:
    """The `template` (module scope: `setup` once) and `workspace` (each row's copy) fixtures of a table's module:
    `template, workspace = workspace_fixtures("name", setup)`."""

    @pytest.fixture(scope="module")
    def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The workspace, built once."""
        return build_template(tmp_path_factory, name, setup)

    @pytest.fixture
    def workspace(template: Path, tmp_path: Path) -> Path:
        """This row's copy of the workspace."""
        return copy_workspace(template, tmp_path)

    return template, workspace


@dataclass(frozen=True)
class Case:
    """One command line, run in the workspace, that must be refused."""

    args: tuple[str, ...]
    code: int
    fragments: tuple[str, ...]
    stdin: str | None = None
    process: bool = False  # run in a subprocess of its own


def case(*args: str, code: int, says: tuple[str, ...], stdin: str | None = None, process: bool = False) -> Case:
    """A row of the table."""
    return Case(tuple(args), code, says, stdin, process)


def run_cli(case_dir: Path, case: Case) -> subprocess.CompletedProcess:
    """`seq2onnx ARGS` in a subprocess whose cwd is the workspace and whose HOME is beside it."""
    home = case_dir.parent / HOME
    args = [a.replace("{home}", str(home)) for a in case.args]
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=case_dir, env=env, input=case.stdin,
                          capture_output=True, text=True, timeout=300)


def run_in_process(case_dir: Path, case: Case) -> subprocess.CompletedProcess:
    """`seq2onnx ARGS` through click's CliRunner, with the workspace as cwd and HOME beside it; an exception that
    escaped the command is shown as the traceback a real process would print."""
    from click.testing import CliRunner

    from cli.main import main

    home = case_dir.parent / HOME
    args = [a.replace("{home}", str(home)) for a in case.args]
    before = process_state()
    cwd = os.getcwd()
    os.chdir(case_dir)
    try:
        result = CliRunner().invoke(main, args, input=case.stdin, env={"HOME": str(home)}, prog_name="seq2onnx")
    finally:
        os.chdir(cwd)
    after = process_state()
    if before[-1] is None:  # torch was first loaded by this command: its threads are torch's own default
        after = (*after[:-1], None)
    changed = {name: (was, now) for name, was, now in zip(STATE_PARTS, before, after) if was != now}
    if "environment" in changed:
        was, now = changed["environment"]
        changed["environment"] = {k: (was.get(k), now.get(k)) for k in {*was, *now} if was.get(k) != now.get(k)}
    assert not changed, f"a refused command changed its process: {changed}"
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, stderr)


# Variables pytest, and torch and Ray on first use of some of their parts, set for themselves: not ours to judge.
FOREIGN_VARIABLES = ("PYTEST_CURRENT_TEST", "TORCH", "RAY_")
STATE_PARTS = ("environment", "working directory", "SIGINT handler", "SIGTERM handler", "torch threads")


def process_state() -> tuple[Any, ...]:
    """What a command could leave changed in its process: environment (FOREIGN_VARIABLES aside), working
    directory, SIGINT and SIGTERM handlers, PyTorch's threads (when loaded)."""
    import signal

    torch = sys.modules.get("torch")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_VARIABLES)}
    return (environment, os.getcwd(), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
            torch.get_num_threads() if torch is not None else None)


def assert_refused(workspace: Path, case: Case) -> None:
    """The row's exit code and one `Error:` line holding its fragments; no traceback; no file changed."""
    before = tree_hash(workspace.parent)
    result = (run_cli if case.process else run_in_process)(workspace, case)
    assert result.returncode == case.code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    for fragment in case.fragments:
        assert fragment in errors[0], (fragment, errors[0])
    if case.code == BAD_INPUT:  # a bad file is not a usage mistake: one line, no usage block
        assert result.stderr.strip() == errors[0] or "Usage:" not in result.stderr, result.stderr
    assert "weights_only=False" not in result.stderr
    assert tree_hash(workspace.parent) == before, "a refused command changed files"


def assert_api_refused(workspace: Path, call: Callable[[Path], Any], error: type, fragments: tuple[str, ...]) -> None:
    """`call` raises `error` with one line holding the fragments, and no file of the workspace changes."""
    before = tree_hash(workspace.parent)
    with pytest.raises(error) as info:
        call(workspace)
    message = str(info.value)
    assert "\n" not in message and len(message) < 1000, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert tree_hash(workspace.parent) == before
