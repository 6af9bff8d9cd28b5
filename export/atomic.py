"""What an export may replace: an earlier export, only with force, and only when it holds nothing else."""
from __future__ import annotations

from pathlib import Path

from runtime.contract import (
    BEAM_STEP_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FAST_FILES,
    GREEDY_FILE,
    MANIFEST_FILE,
    VOCAB_FILES,
)
from runtime.destination import check_destination as check_writable

EXPORT_FILES = frozenset({MANIFEST_FILE, ENCODER_FILE, DECODER_STEP_FILE, GREEDY_FILE, BEAM_STEP_FILE,
                          *VOCAB_FILES.values(), *FAST_FILES.values()})


def check_destination(out: Path, force: bool) -> None:
    """Refuse protected paths, non-exports, exports holding the user's own files, and any export without force."""
    check_writable(out, force, kind="export", marker=MANIFEST_FILE, owned=EXPORT_FILES)
