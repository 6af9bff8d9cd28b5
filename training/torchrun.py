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


def partial_launch_env() -> str | None:
    """A message when the environment names this process a rank (RANK or WORLD_SIZE) but lacks the rest of what
    torchrun sets, so it is no rank at all; None otherwise. Such a process trained alone, silently, as if the run
    it was meant to join did not exist. MASTER_ADDR or MASTER_PORT alone are only configuration: no message."""
    given = [name for name in LAUNCH_ENV if name in os.environ]
    if not {"RANK", "WORLD_SIZE"} & set(given) or len(given) == len(LAUNCH_ENV):
        return None
    missing = [name for name in LAUNCH_ENV if name not in os.environ]
    claims = [name for name in ("RANK", "WORLD_SIZE") if name in os.environ]
    return (f"{', '.join(f'{n}={os.environ[n]!r}' for n in given)} in the environment without "
            f"{', '.join(missing)}: a process started by hand as one rank of a run needs all of "
            f"{', '.join(LAUNCH_ENV)} (torchrun sets them); set the rest, or unset {' and '.join(claims)} "
            "to train in one process")


def launch_env_problem() -> str | None:
    """What is wrong with the launch variables this process was started with, in a few words; None when usable.
    A rank started by hand with a RANK or port that is no number met a ValueError traceback in torch's
    rendezvous, and one with RANK >= WORLD_SIZE waited 30 minutes for peers that could never come."""
    counts = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        value = os.environ[name]
        if not value.isdigit():
            return f"{name}={value!r}: expected a whole number 0 or more"
        counts[name] = int(value)
    if counts["WORLD_SIZE"] < 1:
        return "WORLD_SIZE=0: expected 1 process or more"
    if counts["RANK"] >= counts["WORLD_SIZE"]:
        return f"RANK={counts['RANK']} of WORLD_SIZE={counts['WORLD_SIZE']}: a rank is 0 to WORLD_SIZE - 1"
    if not 1 <= counts["MASTER_PORT"] <= 65535:
        return f"MASTER_PORT={counts['MASTER_PORT']}: expected a port, 1 to 65535"
    return None
