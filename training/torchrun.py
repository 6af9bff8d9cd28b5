"""What torchrun tells a process through its environment. Torch-free, so the command line can ask before torch loads."""
from __future__ import annotations

import os

from .errors import RunError

# What torch's env:// rendezvous reads: torchrun sets these for a worker (and LOCAL_RANK, which this project reads
# where given, else 0); other launchers (a Kubernetes PyTorchJob, a hand-written script) may set only these four.
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ALONE = {"RANK": "0", "WORLD_SIZE": "1"}  # what these say of a process that is a run by itself


def launched() -> bool:
    """True in a process that a launcher started as a rank of a run (its rank and rendezvous are in the
    environment)."""
    return all(name in os.environ for name in LAUNCH_ENV)


def quiet_rank() -> bool:
    """A rank other than 0 of a launched run: where the run stops (Ctrl-C, SIGTERM), rank 0 says so, once for the
    run, and this rank leaves with the same status and no line of its own."""
    return launched() and os.environ.get("RANK", "0") != "0"


def whole(value: str) -> bool:
    """Whether `value` is a whole number in ASCII digits: str.isdigit() also takes '²' and '٢', which int() refuses
    or reads as another digit (a traceback, or a WORLD_SIZE said as '٢')."""
    return value.isascii() and value.isdigit()


def env_count(name: str) -> int:
    """A count torchrun gives in the environment (its restarts so far, the restarts allowed): 0 when unset."""
    value = os.environ.get(name, "0")
    if not whole(value):
        raise RunError(f"{name}={value!r} in the environment: expected a whole number 0 or more (torchrun sets it); "
                       "unset it, or launch with torchrun or --nproc-per-node")
    return int(value)


def partial_launch_env() -> str | None:
    """A message when the environment says this process is one rank of several (a RANK above 0, a WORLD_SIZE
    above 1) but lacks the rest of what the rendezvous needs; None otherwise. Such a process trained alone,
    silently, as if the run it was meant to join did not exist. RANK=0 or WORLD_SIZE=1 alone, and MASTER_ADDR or
    MASTER_PORT alone (configuration), describe a process that runs by itself: no message."""
    if launched():
        return None
    claims = {name: os.environ[name] for name in ALONE if name in os.environ}
    if all(value == ALONE[name] for name, value in claims.items()):
        return None
    given = [name for name in LAUNCH_ENV if name in os.environ]
    missing = [name for name in LAUNCH_ENV if name not in os.environ]
    return (f"{', '.join(f'{n}={os.environ[n]!r}' for n in given)} in the environment without "
            f"{', '.join(missing)}: a process started as one rank of a run needs all of {', '.join(LAUNCH_ENV)} "
            f"(torchrun sets them); set the rest, or unset {' and '.join(claims)} to train in one process")


def launch_env_problem() -> str | None:
    """What is wrong with the launch variables this process was started with, in a few words; None when usable.
    A rank started by hand with a RANK or port that is no number met a ValueError traceback in torch's
    rendezvous, and one with RANK >= WORLD_SIZE waited 30 minutes for peers that could never come."""
    counts = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        value = os.environ.get(name, "1" if name == "LOCAL_WORLD_SIZE" else "0")  # the LOCAL_ ones: where not given
        if not whole(value) or (name.endswith("WORLD_SIZE") and int(value) < 1):
            return f"{name}={value!r}: expected " + ("a port, 1 to 65535" if name == "MASTER_PORT" else
                                                     "a whole number, 1 or more" if name.endswith("WORLD_SIZE") else
                                                     "a whole number, 0 or more")
        counts[name] = int(value)
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if counts[rank] >= counts[size] and size in os.environ:  # a launcher may give LOCAL_RANK alone
            return f"{rank}={counts[rank]} of {size}={counts[size]}: a rank is 0 to {size} - 1"
    if counts["LOCAL_WORLD_SIZE"] > counts["WORLD_SIZE"]:
        return (f"LOCAL_WORLD_SIZE={counts['LOCAL_WORLD_SIZE']} of WORLD_SIZE={counts['WORLD_SIZE']}: a machine's "
                "processes are some of the run's")
    if not 1 <= counts["MASTER_PORT"] <= 65535:
        return f"MASTER_PORT={counts['MASTER_PORT']}: expected a port, 1 to 65535"
    address = os.environ.get("MASTER_ADDR", "")
    if not address or address != address.strip():  # torch's rendezvous: a traceback ('expected, but not set')
        return f"MASTER_ADDR={address!r}: expected the host name or address of rank 0's machine"
    return _too_many_here(counts["LOCAL_WORLD_SIZE"])


def _too_many_here(here: int) -> str | None:
    """More processes on this machine (torchrun's LOCAL_WORLD_SIZE) than CPUs this process may use: refused, as
    `train --nproc-per-node` refuses it (oversubscribed ranks wait on each other at every all-reduce)."""
    from runtime.defaults import max_threads

    cpus = max_threads()
    if here > cpus:
        return (f"LOCAL_WORLD_SIZE={here}: {here} processes on this machine, more than the {cpus} CPU"
                f"{'' if cpus == 1 else 's'} this process may use; each training process needs one of its own "
                f"(oversubscribed, they wait on each other at every all-reduce), so start at most {cpus} here "
                f"(torchrun --nproc-per-node {cpus})")
    return None
