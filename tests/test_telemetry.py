"""onnxruntime's telemetry (1.29+ on Linux: usage events sent to Microsoft, a device id and an event cache under
~/.cache) is off in the program's processes unless ORT_DISABLE_TELEMETRY says otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from cli.cluster import runtime_env

from support.serve import DATES

# what onnxruntime reads to decide (it records nothing where a CI variable is set); the test sets them itself
DECIDING = ("ORT_DISABLE_TELEMETRY", "CI", "GITHUB_ACTIONS", "TF_BUILD", "XDG_CACHE_HOME")
KEPT = Path(".cache") / "Microsoft" / "DeveloperTools" / ".onnxruntime"  # under HOME: its device id, its events

pytestmark = pytest.mark.skipif(tuple(int(p) for p in ort.__version__.split(".")[:2]) < (1, 29),
                                reason="onnxruntime before 1.29 has no telemetry on Linux")


def _infer_with_home(home: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in DECIDING}
    return subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--text", "3/3/15"], cwd=DATES,
                          env={**base, "HOME": str(home), **env}, capture_output=True, text=True, timeout=120)


def test_the_program_runs_onnxruntime_without_its_telemetry(tmp_path: Path) -> None:
    """Nothing of onnxruntime's telemetry under HOME after a decode (it kept a device id and an event cache)."""
    done = _infer_with_home(tmp_path)
    assert done.returncode == 0 and "2015-03-03" in done.stdout, done.stderr
    assert not (tmp_path / ".cache").exists(), sorted(map(str, tmp_path.rglob("*")))


def test_a_home_that_cannot_be_written_gives_no_warning(tmp_path: Path) -> None:
    """A read-only HOME (a container's): onnxruntime warned at every start that it could not keep its device id."""
    done = _infer_with_home(Path("/dev/null/home"))
    assert done.returncode == 0 and "2015-03-03" in done.stdout, done.stderr
    assert "telemetry" not in done.stderr, done.stderr


def test_the_users_own_choice_stands(tmp_path: Path) -> None:
    """ORT_DISABLE_TELEMETRY=0 set by the user is left as it is: onnxruntime keeps its telemetry then."""
    done = _infer_with_home(tmp_path, ORT_DISABLE_TELEMETRY="0")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / KEPT).is_dir(), sorted(map(str, tmp_path.rglob("*")))


def test_a_job_takes_the_choice_to_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas and actors on a cluster's nodes are started by its raylets, not by this process: the job's
    runtime_env carries the variable, as it carries the model directory."""
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "1")
    assert runtime_env("/models/dates") == {"env_vars": {"ORT_DISABLE_TELEMETRY": "1"},
                                            "working_dir": "/models/dates"}
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY")
    assert runtime_env(None) == {"env_vars": {}}
