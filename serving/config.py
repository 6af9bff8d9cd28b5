"""A served model's settings: one frozen dataclass shared by the CLI, the deployment and its replicas."""
from __future__ import annotations

import contextlib
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.defaults import MAX_TARGET_LEN, PROVIDERS
from runtime.errors import InputError, brief
from runtime.search.beam import MAX_BEAM

MAX_BATCH_LIMIT = 4096
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_MAX_DECODING = 512  # beam search cost grows faster than the length: 50,000 steps held a replica for minutes
# a beam search holds texts x beam rows of state: the 1-epoch dates transformer, 32 texts decoded to 64 tokens,
# took the process to 4.5 GB at beam 256 (and 30 s); to 1.2 GB at beam 16 and 512 tokens
DEFAULT_MAX_BEAM_SIZE = 16
DEFAULT_MAX_QUEUE = 256  # items waiting for a decode (8 full default batches); beyond it a request gets 503 at once
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_BODY_TIMEOUT_S = 30.0  # a body trickled in (or never ended) holds a connection no longer than this
MAX_QUEUE_LIMIT = 1 << 20
MAX_REPLICAS = 1 << 16  # a bound for a typo's sake: Serve would try to place them all
MAX_WORKERS = 1024  # the bound a config can state; loading checks workers x threads against the CPUs
_NUMBERS = [  # ServeConfig's numbers: name, low, high, integer
    ("num_cpus", 0.01, float(os.cpu_count() or 1) * 1024, False),
    ("max_batch_size", 1, MAX_BATCH_LIMIT, True),
    ("batch_wait_ms", 0.0, 10_000.0, False),
    ("max_body_bytes", 1024, 1 << 30, True),
    ("max_decoding_length", 1, MAX_TARGET_LEN, True),
    ("max_beam_size", 1, MAX_BEAM, True),
    ("max_queue", 1, MAX_QUEUE_LIMIT, True),
    ("request_timeout_s", 0.01, 3600.0, False),
    ("body_timeout_s", 0.01, 3600.0, False),
    ("workers", 1, MAX_WORKERS, True),
]


def check_number(name: str, value: Any, low: float, high: float, integer: bool = False) -> int | float:
    """`value` as a Python int (integer) or else float, if it is a number from `low` to `high` (numpy's too);
    else InputError naming `name`. A bool is refused, and an integer's float form (2.0) is not an integer."""
    kind = numbers.Integral if integer else numbers.Real
    number = None
    if isinstance(value, kind) and not isinstance(value, (bool, np.bool_)):
        with contextlib.suppress(OverflowError):  # float(10**400)
            number = int(value) if integer else float(value)  # compared as stored: np.float32(0.01) < 0.01
    if number is None or not low <= number <= high:
        said, bounds = ("an integer", f"{int(low)} to {int(high)}") if integer else ("a number", f"{low:g} to {high:g}")
        stored = f" ({number!r} as a Python float)" if number is not None and low <= value <= high else ""
        raise InputError(f"{name}: expected {said} from {bounds}, got {brief(value)}{stored}")
    return number


@dataclass(frozen=True)
class Replicas:
    """A fixed count (low == high) or autoscaling bounds."""

    low: int
    high: int

    def __post_init__(self) -> None:
        for name in ("low", "high"):  # Python ints (numpy's made so), as Serve's options take them
            object.__setattr__(self, name, check_number(f"replicas.{name}", getattr(self, name), 1, MAX_REPLICAS,
                                                        integer=True))
        if self.low > self.high:
            raise InputError(f"replicas: expected low <= high, got {self.low} > {self.high}")

    @property
    def fixed(self) -> bool:
        return self.low == self.high


@dataclass(frozen=True)
class ServeConfig:
    """How each server (the one process, or each Ray Serve replica) loads, batches and bounds its work.
    max_batch_size counts items (points sources or texts), summed over the requests merged into one decode; a
    request may hold at most that many. max_queue: items that may wait for a decode (503 beyond);
    request_timeout_s: how long a request may wait for its answer (408 beyond, and its decode stops);
    body_timeout_s: how long its body may take to arrive after its headers (408 beyond, and the connection closes)."""

    provider: str = "auto"
    num_cpus: float = 1.0
    max_batch_size: int = 32
    batch_wait_ms: float = 0.0  # requests that arrive during a decode form the next batch anyway
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decoding_length: int = DEFAULT_MAX_DECODING
    max_beam_size: int = DEFAULT_MAX_BEAM_SIZE
    replicas: Replicas = Replicas(1, 1)
    max_queue: int = DEFAULT_MAX_QUEUE
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    workers: int = 1  # copies of the model in one process, each decoding a batch of its own at once (not on Ray)

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise InputError(f"provider: expected one of {list(PROVIDERS)}, got {brief(self.provider)}")
        for name, low, high, integer in _NUMBERS:
            object.__setattr__(self, name, check_number(name, getattr(self, name), low, high, integer))
        if not isinstance(self.replicas, Replicas):
            raise InputError(f"replicas: expected a Replicas(low, high), got {brief(self.replicas)}")
        if self.batch_wait_ms / 1000 >= self.request_timeout_s:  # a lone request would time out waiting, every time
            raise InputError(f"batch_wait_ms: {self.batch_wait_ms:g} ms is not under request_timeout_s "
                             f"({self.request_timeout_s:g} s): a request that finds no other to batch with would "
                             "wait its whole deadline; lower --batch-wait-ms or raise --request-timeout")

    @property
    def threads(self) -> int:
        """onnxruntime intra-op threads: the replica's CPUs (it ignores OMP_NUM_THREADS; more would oversubscribe)."""
        return max(1, math.floor(self.num_cpus))

    @property
    def max_ongoing_requests(self) -> int:
        """What Serve lets through to a replica: a full queue and a batch under way (each request holds at least
        one item), so the service's own bound decides (503 with Retry-After), not Serve's default of 5."""
        return self.max_queue + self.max_batch_size


def parse_replicas(text: str, cluster_cpus: float | None = None, num_cpus: float = 1.0) -> Replicas:
    """'N' (fixed), 'MIN:MAX' (autoscaling) or 'auto' (1 to what the cluster's CPUs hold at num_cpus each)."""
    if text == "auto":
        high = min(max(1, math.floor((cluster_cpus or os.cpu_count() or 1) / num_cpus)), MAX_REPLICAS)
        return Replicas(1, high)
    low_text, colon, high_text = text.partition(":")
    try:
        if not (low_text.isdigit() and (high_text.isdigit() or not colon)):
            raise ValueError
        low, high = int(low_text), int(high_text or low_text)
    except ValueError:
        raise InputError(f"replicas: expected N, MIN:MAX or auto, got {text!r}") from None
    if not 1 <= low <= high <= MAX_REPLICAS:
        raise InputError(f"replicas: expected 1 <= MIN <= MAX <= {MAX_REPLICAS}, got {text!r}")
    return Replicas(low, high)
