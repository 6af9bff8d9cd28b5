"""What torchrun tells a process through its environment. Torch-free, so the command line can ask before torch loads."""
from __future__ import annotations

import os

from .errors import RunError

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets for a worker


def launched() -> bool:
    """True in a process that torchrun started (its rank and rendezvous are in the environment)."""
    return all(name in os.environ for name in LAUNCH_ENV)


def env_count(name: str) -> int:
    """A count torchrun gives in the environment (its restarts so far, the restarts allowed): 0 when unset."""
    value = os.environ.get(name, "0")
    if not value.isdigit():
        raise RunError(f"{name}={value!r} in the environment: expected a whole number 0 or more (torchrun sets it); "
                       "unset it, or launch with torchrun or --nproc-per-node")
    return int(value)
