"""The CUDA device a session asks for: its ordinal checked, the provider's options, and why it would not start."""
from __future__ import annotations

import numbers
import re
from typing import Any

from .errors import InputError, ProviderError, brief, one_line

MAX_DEVICE_ID = 2**31 - 1  # onnxruntime reads the ordinal as a C int
# onnxruntime-gpu's words for an ordinal past the GPUs it sees (1.31.1 on an H200, device_id 3)
_NO_SUCH_DEVICE = re.compile(r"Invalid device ID: (\d+), must be between 0 \(inclusive\) and (\d+) \(exclusive\)")


def check_device_id(device_id: Any) -> int:
    """A CUDA device ordinal: an int from 0 to MAX_DEVICE_ID, on any provider (a value no GPU can have is a
    mistake whether or not a GPU is used)."""
    if (isinstance(device_id, bool) or not isinstance(device_id, numbers.Integral)
            or not 0 <= device_id <= MAX_DEVICE_ID):
        raise InputError(f"device_id: expected an int from 0 to {MAX_DEVICE_ID} (a CUDA device ordinal, 0 for the "
                         f"first GPU), got {brief(device_id)}")
    return int(device_id)


def cuda_options(device_id: int) -> dict[str, str]:
    """The CUDA provider's options. TF32 off: onnxruntime's CUDA matmuls round their inputs to TF32 by default
    on Ampere and later, which on an H200 put the squares model 4.0e-2 off the CPU (1.4e-5 without) and beam
    scores 9.6e-4 relative (7.7e-7 without; the README's GPU section); full float32 keeps the parity the export
    checked. device_id only when not 0: onnxruntime-gpu 1.31 warns "No registered plugin EP device found" for every
    session given one."""
    return {"use_tf32": "0", **({"device_id": str(device_id)} if device_id else {})}


def cuda_start_error(name: str, providers: list[str], device_id: int, exc: BaseException) -> ProviderError:
    """Why a session asked for CUDA on `device_id` could not start: an ordinal past the GPUs onnxruntime sees is
    said as such (onnxruntime's own words came wrapped in its source paths), anything else in onnxruntime's."""
    found = _NO_SUCH_DEVICE.search(str(exc))
    if found is not None:
        count = int(found.group(2))
        if not count:
            return ProviderError(f"{name}: there is no CUDA device {device_id}: onnxruntime sees no CUDA device; "
                                 "pass provider 'cpu' (--provider cpu)")
        ids = f"device_id 0{f' to {count - 1}' if count > 1 else ''}"
        return ProviderError(f"{name}: there is no CUDA device {device_id}: onnxruntime sees {count} CUDA "
                             f"device{'' if count == 1 else 's'} ({ids}); pass one of those as device_id (infer "
                             "--device-id), or provider 'cpu'")
    return ProviderError(f"{name}: onnxruntime could not start a session with {providers} on CUDA device {device_id} "
                         f"({one_line(exc)})")
