"""torchrun's log directory for one run of `train --nproc-per-node` (`cli.launch`): made in the temp directory,
removed when the run ends, and removed by a later run where its launcher was killed outright."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from runtime.errors import held_signals

LOGS_PREFIX = "seq2onnx-torchrun-"
HELD = ".held"  # in a run's log directory: flocked by its launcher while the run lasts


@contextlib.contextmanager
def torchrun_logs() -> Iterator[str]:
    """torchrun's log directory for one run (its ranks' error files; left to itself, torchrun leaves a
    /tmp/torchelastic_* behind after every run), in the temp directory, removed when the run ends however it ends.
    A launcher killed outright (SIGKILL) cannot remove its own, so each run first removes those whose launcher is
    gone: its flock on the directory's HELD file ended with it (a lock, not a pid, so a launcher in another pid
    namespace sharing the directory keeps its own)."""
    sweep_torchrun_logs()
    logs = fd = None
    try:
        with held_signals():  # a stop as it is made lands once there is a name to remove (it stayed for good:
            logs = tempfile.mkdtemp(prefix=LOGS_PREFIX)  # no HELD in it, which a sweep leaves alone)
            making = os.path.join(logs, f"{HELD}.new")
            fd = os.open(making, os.O_CREAT | os.O_RDWR, 0o600)  # not inherited: the ranks never hold it
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(making, os.path.join(logs, HELD))  # a sweep finds HELD only once it is held
        yield logs
    finally:
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def sweep_torchrun_logs() -> list[Path]:
    """Remove the run log directories in the temp directory whose launcher is gone; returns them."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{LOGS_PREFIX}*"):
        if path.is_symlink():  # never a run's: runs make real directories
            continue
        try:
            fd = os.open(path / HELD, os.O_RDWR)
        except OSError:  # being made or removed, or not a run's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its launcher runs
            continue
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
