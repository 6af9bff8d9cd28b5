"""torchrun's log directory for a `train --nproc-per-node` run (cli.run_logs): removed when the run ends, and by a
later run where the launcher was killed outright, never while its launcher lives. Real processes and real flocks;
no torch (tests/test_distributed.py kills a real launcher)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cli.run_logs import HELD, LOGS_PREFIX, sweep_torchrun_logs, torchrun_logs

from support.processes import default_stops

ROOT = Path(__file__).resolve().parents[1]
HOLDER = ("import sys, time; from cli.run_logs import torchrun_logs\n"
          "with torchrun_logs() as logs:\n    print(logs, flush=True)\n    time.sleep(120)\n")


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp directory of this process and of the processes it starts."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _runs(temp: Path) -> list[str]:
    return sorted(p.name for p in temp.iterdir() if p.name.startswith(LOGS_PREFIX))


def test_the_directory_is_held_while_the_run_lasts_and_removed_after_however_it_ends(temp: Path) -> None:
    with torchrun_logs() as logs:
        assert Path(logs).parent == temp and (Path(logs) / HELD).is_file()
        assert sweep_torchrun_logs() == [] and Path(logs).is_dir()  # its own launcher holds it
    assert _runs(temp) == []
    with pytest.raises(KeyError), torchrun_logs() as logs:
        raise KeyError("the run failed")
    assert _runs(temp) == []


def test_a_killed_launchers_directory_goes_at_the_next_sweep_a_living_ones_stays(temp: Path) -> None:
    holders = [subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        dirs = [Path(h.stdout.readline().strip()) for h in holders]  # type: ignore[union-attr]
        assert all(d.parent == temp and (d / HELD).is_file() for d in dirs)
        not_a_run = temp / f"{LOGS_PREFIX}other"  # no HELD: not a run's, or one being made
        not_a_run.mkdir()
        (temp / f"{LOGS_PREFIX}file").write_text("")
        elsewhere = temp / "elsewhere"  # a link to a directory that looks like a gone run's: neither is touched
        elsewhere.mkdir()
        (elsewhere / HELD).write_text("")
        (temp / f"{LOGS_PREFIX}link").symlink_to(elsewhere)
        assert sweep_torchrun_logs() == []
        os.kill(holders[0].pid, signal.SIGKILL)  # no finally, no cleanup: its directory stays behind
        holders[0].wait(10)
        assert dirs[0].is_dir()
        assert sweep_torchrun_logs() == [dirs[0]]
        assert not dirs[0].exists() and dirs[1].is_dir() and not_a_run.is_dir() and (elsewhere / HELD).is_file()
        with torchrun_logs():  # a run sweeps first: the second holder's directory is still its own
            assert dirs[1].is_dir()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(10)
    with torchrun_logs():
        assert not dirs[1].exists()  # its holder was killed too: the next run removed it
    assert _runs(temp) == sorted([not_a_run.name, f"{LOGS_PREFIX}file", f"{LOGS_PREFIX}link"])


AT_MKDTEMP = """
import os, signal, sys
from cli.run_logs import torchrun_logs
def stop_as_it_returns(frame, event, arg):  # mkdtemp has made the directory and returns its name
    if event == "return" and frame.f_code.co_name == "mkdtemp":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)
def arm(event, args):  # mkdtemp audits the name it is about to make
    if event == "tempfile.mkdtemp":
        sys.setprofile(stop_as_it_returns)
sys.addaudithook(arm)
try:
    with torchrun_logs():
        print("ran the block")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_as_the_directory_is_made_leaves_nothing(temp: Path) -> None:
    """A Ctrl-C that landed once `mkdtemp` had made the directory, before the `try` that removes it, left it in the
    temp directory for good (without HELD, which a later sweep leaves alone). Here it is sent as mkdtemp returns
    the name of the directory it made (a profile function, set as mkdtemp audits the name): it lands once the
    directory can be removed, and is still a Ctrl-C."""
    done = subprocess.run([sys.executable, "-c", AT_MKDTEMP], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(temp)}, preexec_fn=default_stops)  # xdist ignores it
    assert done.stdout.split() == ["interrupted"], done.stdout + done.stderr
    assert _runs(temp) == []

