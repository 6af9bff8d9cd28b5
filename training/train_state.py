"""A training run's resumable state (`train_state.pt`: optimizer, RNG states, epoch): where `--resume` finds it,
written atomically after every saved epoch, read back with `weights_only=True`, and checked against the checkpoint
it belongs to. While a run is in progress it lives in `<out>.partial/`, removed once `<out>` exists."""
from __future__ import annotations

import contextlib
import stat
from pathlib import Path
from typing import Any

from runtime.contract import CHECKPOINT_SPEC_FILE, CHECKPOINT_STATE_FILE, partial_dir

from .checkpoint import CheckpointError, read_meta
from .torch_files import load_torch, save_torch

STATE_KEYS = ("format_version", "epoch", "spec", "config", "history", "model", "optimizer",
              "torch_rng", "shuffle_rng", "data")


def find_resume_state(out: str | Path) -> Path | None:
    """The state to resume `out` from: an interrupted run's first, else a finished checkpoint's, else None."""
    for candidate in (partial_dir(out) / CHECKPOINT_STATE_FILE, Path(out) / CHECKPOINT_STATE_FILE):
        if candidate.is_file():
            return candidate
        if candidate.exists():  # a directory, a named pipe: not "nothing to resume"
            raise CheckpointError(f"training state {str(candidate)!r} is not a regular file (mode "
                                  f"{stat.filemode(candidate.stat().st_mode)}); move it away, or run without --resume to "
                                  "start afresh")
    return None


def clear_partial(out: str | Path) -> None:
    """Remove `<out>.partial`: its state file and our temp leftovers; anything else in it is left alone."""
    partial = partial_dir(out)
    if not partial.is_dir():
        return
    for leftover in [partial / CHECKPOINT_STATE_FILE, *partial.glob(f".{CHECKPOINT_STATE_FILE}.*.tmp")]:
        leftover.unlink(missing_ok=True)
    try:
        partial.rmdir()
    except OSError:
        pass  # holds files we did not write; leave them to the user


def save_train_state(path: str | Path, state: dict[str, Any], data: dict[str, Any]) -> None:
    """Atomically write a trainer's `state_dict()` plus the data description to `path`."""
    path = Path(path)
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_torch(path, {**state, "data": data}, CheckpointError, atomic=True)
    except CheckpointError:
        if made:  # the run's first state: leave no empty `.partial` behind
            with contextlib.suppress(OSError):
                path.parent.rmdir()
        raise


def load_train_state(path: str | Path) -> dict[str, Any]:
    """Read a training-state file written by `save_train_state` (tensors only, `weights_only=True`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"training state {str(path)!r} does not exist; run without --resume to start afresh")
    state = load_torch(path, "training state", "delete it and start afresh without --resume (and with --force "
                       "where it belongs to a finished checkpoint)", CheckpointError)
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"training state {str(path)!r} lacks {missing}; it was not written by seq2onnx train")
    return state


def check_state_of(out: str | Path, state_file: Path, state: dict[str, Any]) -> None:
    """A finished checkpoint's state (`state_file` in `out`) is of the model its spec.json holds, where it holds
    one. Not for an interrupted run's state, in `<out>.partial`: that is the run that will replace `out`, and a
    --force run may train another model there."""
    if not (Path(out) / CHECKPOINT_SPEC_FILE).is_file():
        return
    meta = read_meta(out)
    saved = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
    differ = sorted(k for k in {*saved, *state["spec"]} if saved.get(k) != state["spec"].get(k))
    if differ:
        raise CheckpointError(f"training state {str(state_file)!r} is of another model than "
                              f"{str(Path(out) / CHECKPOINT_SPEC_FILE)!r} (they differ in {differ[:6]}); resume the "
                              "directory it was saved in, or start afresh with --force")
