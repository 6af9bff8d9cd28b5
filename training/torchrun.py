"""What torchrun tells a process through its environment. Torch-free, so the command line can ask before torch loads."""
from __future__ import annotations

import os

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets for a worker


def launched() -> bool:
    """True in a process that torchrun started (its rank and rendezvous are in the environment)."""
    return all(name in os.environ for name in LAUNCH_ENV)
