"""The execution devices the tests run on: CPU, and CUDA where a session really gets it."""
from __future__ import annotations

import platform
import sys

import onnxruntime as ort

from runtime.bench import identity_graph
from runtime.sessions import CUDA


def cuda_unavailable() -> str | None:
    """None when a session asked for CUDA reports it in get_providers(), else the reason it does not.

    onnxruntime-gpu lists CUDA in get_available_providers() even without a GPU; such a session falls back to the
    CPU, which is the answer here. A session that raises instead is not caught: the probe graph itself is wrong
    (onnxruntime-gpu 1.31, the newest GPU build, refuses the IR 14 that onnx 1.23's helpers write by default, and
    a probe that swallowed that error kept every CUDA row of the suite from running on a real GPU)."""
    if CUDA not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDA provider ({ort.get_available_providers()})"
    session = ort.InferenceSession(identity_graph(), providers=[CUDA])
    if CUDA not in session.get_providers():
        return f"a CUDA session of onnxruntime {ort.__version__} fell back to {session.get_providers()}"
    return None


CUDA_UNAVAILABLE = cuda_unavailable()
DEVICES = ["cpu"] + (["cuda"] if CUDA_UNAVAILABLE is None else [])

# Where runtime.denormals flushes denormals (MXCSR through libm): x86-64 Linux.
X86_LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")
