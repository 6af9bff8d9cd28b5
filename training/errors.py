"""How a training run ends early, as types the command line turns into its messages and exit statuses (stdlib only).

Under torchrun every rank meets the same failure; rank 0 says it and the others leave quietly with its status,
unless a failure is a rank's own news (`this_rank`), which every rank says."""
from __future__ import annotations

import signal
from pathlib import Path

from runtime.errors import Seq2OnnxError


class RunError(Seq2OnnxError, RuntimeError):
    """A run that cannot go on, in one line. `exit_code` 1, or 2 for a usage mistake the ranks meet (no usage block
    follows); `this_rank`: every rank says its own line."""

    def __init__(self, message: str, exit_code: int = 1, this_rank: bool = False) -> None:
        super().__init__(message)
        self.exit_code, self.this_rank = exit_code, this_rank


class OutOfMemory(RunError):
    """A run that found no memory (a MemoryError, torch's refused allocation), with what it kept: every rank says
    its own."""

    def __init__(self, message: str) -> None:
        super().__init__(message, this_rank=True)


class Restarting(RunError):
    """A lost peer while torchrun has restarts left: news (it starts the processes again), not an error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, this_rank=True)


class RunStopped(Seq2OnnxError):
    """Stopped by the user (Ctrl-C) or a signal: exit 130 with one line saying what was kept. Further Ctrl-Cs are
    ignored from here on: what is left is short, and a signal arriving while the interpreter shuts down would kill
    the process with -SIGINT instead of letting it exit 130."""

    exit_code = 130

    def __init__(self, message: str) -> None:
        ignore_further_interrupts()
        super().__init__(message)


class QuietExit(Seq2OnnxError):
    """A rank other than 0 leaves with `exit_code` and no message of its own (rank 0 says why)."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"exit {exit_code}")
        self.exit_code = exit_code


def ignore_further_interrupts() -> None:
    """From here on Ctrl-C does nothing (see RunStopped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def unchanged(out: Path) -> str:
    """What a --resume that extends the finished checkpoint `out` kept when it stopped before saving a state."""
    return f"{str(out)!r} is as it was; rerun with --resume to extend it"


def state_unchanged(state_file: Path) -> str:
    """What a --resume of the interrupted run in `state_file` kept when it stopped before saving a state."""
    return f"the saved state in {str(state_file)!r} is as it was; rerun with --resume to continue"
