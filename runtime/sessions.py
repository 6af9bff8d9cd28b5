"""onnxruntime sessions: thread bounds, provider choice that tells the truth, and graph files read safely."""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Iterator

import onnxruntime as ort

from .cuda import check_device_id, cuda_options, cuda_start_error
from .defaults import PROVIDERS, max_threads
from .denormals import keeping_flags, session_flag
from .errors import InputError, IntegrityError, ProviderError, ResourceError, brief, int_text, one_line
from .model_files import check_sha256, read_regular_file

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
MAX_GRAPH_BYTES = (2 << 30) - 1  # protobuf cannot parse a larger message; larger models need external data
# what onnxruntime says when a session cannot start its threads or get memory: a limit, not a broken graph
SHORT_OF = ("pthread_create failed", "Cannot allocate memory", "std::bad_alloc")

# External data: onnxruntime 1.31, given a graph as bytes, resolves a tensor's external-data location against the
# process's current directory and reads it (it refuses only absolute paths and '..'), so a graph could pull in any
# file beside the service. No session option forbids external data, so read_graph scans the protobuf itself and
# refuses any tensor that is not stored inline. Field numbers from onnx.proto, for every message on a path from
# ModelProto to a TensorProto (subgraphs of If/Loop, Constant values, functions and sparse tensors included).
SUBMESSAGES: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training_info", 25: "function"},
    "training_info": {1: "graph", 2: "graph"},
    "function": {7: "node", 11: "attribute"},
    "graph": {1: "node", 5: "tensor", 15: "sparse_tensor"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse_tensor", 23: "sparse_tensor"},
    "sparse_tensor": {1: "tensor", 2: "tensor"},
}
TENSOR_NAME, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION, EXTERNAL = 8, 13, 14, 1
MAX_NESTING = 100  # protobuf's own default recursion limit
VARINT, LENGTH_DELIMITED, FIXED64, FIXED32 = 0, 2, 1, 5

# Session defaults, measured with benchmarks/cpu_step_bench.py on a 2-core machine (figures in its docstring).
# Intra-op threads for threads=None. onnxruntime's own default is every physical core per session, and a model has
# two or three sessions; in a container whose CPU quota is below its affinity mask, or beside other workers, that
# oversubscribes the CPUs. Measured: 2 threads decode points batch 256 1.3-1.6x faster than 1 when the second core
# is free, and cost batch 1 ~1% (the encoder's GRU wakes the worker at every position); on a machine that other
# work keeps busy, 2 threads are up to 1.3x slower than 1 (pass threads=1 there, and to serve requests side by side).
# Beyond 2 threads is a judgement, not a measurement: the step's products at batch 256 (256 x 256 x 512) still split
# well 4 ways, and a session never claims a large server's every core.
DEFAULT_MAX_THREADS = 4
# Worker threads busy-wait after each run (onnxruntime's default) to pick up the next one sooner. Measured: that burns
# ~40 ms of CPU after every call while a service waits for its next request, and halves the speed of a 2-thread
# decode when other work shares the CPUs; it gains 8-14% at batch 256 when the second core is free, nothing at batch 1.
# force_spinning_stop (spin only during a run) burns nothing between calls but collapses the same way under load.
SPINNING = False
ALLOW_SPINNING = "session.intra_op.allow_spinning"
# onnxruntime's CPU arena (BFC) serves every kernel's output. A graph made for small calls (a transformer's one-call
# greedy and beam graphs, below WIDE_GREEDY_INPUTS / WIDE_BEAM_INPUTS inputs) allocates many small tensors a step,
# which the plain allocator serves faster; large calls lose without the arena. Measured (interleaved, 1 thread, the
# dates transformer, 13 + 20 tokens; time without / with the arena): fast_greedy batch 1 0.965-0.987x, batch 7
# 0.988x; fast_beam beam 5 batch 1 0.967-0.978x, batch 4 1.002x, batch 15 0.988x; wide_greedy batch 64 1.007x,
# wide_beam batch 64 1.058x; the GRU's greedy loop 0.91-0.93x at batch 1 but 1.06-1.08x at 64 (it serves both,
# so it keeps the arena). Those are one session a side; with six a side made alternately (two sessions of one graph
# can run ~10% apart): fast_greedy batch 1 0.965-0.976x, fast_beam batch 1 0.970-0.971x. A session with the CUDA
# provider always keeps it: onnxruntime-gpu 1.31 without the CPU arena ran fold_greedy/fold_beam on an H200 with a
# garbage Range limit (its source-length mask, e.g. (1, 1, 813186446, 1): 0 of 10 calls right, at any optimization
# level), and with it 10 of 10; the plain graphs ran right either way.
ARENA = True


def check_threads(threads: Any) -> int | None:
    """None (default_threads() at session creation) or a thread count between 1 and max_threads()."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise InputError(f"threads: expected a positive int or None, got {brief(threads)}")
    threads = int(threads)
    if threads > max_threads():
        raise InputError(
            f"threads: {int_text(threads)} is more than the {max_threads()} CPUs this process may use; more intra-op "
            f"threads than CPUs oversubscribes them and slows every call; pass at most {max_threads()}, or None"
        )
    return threads


# Devices on which an 'auto' session asked for CUDA and got the CPU (onnxruntime-gpu without the CUDA or cuDNN
# libraries, or no such GPU): this process's later 'auto' sessions there ask for the CPU alone.
_CUDA_DID_NOT_START: set[int] = set()


def requested_providers(provider: str) -> list[str]:
    """Translate 'auto' | 'cpu' | 'cuda' into an onnxruntime provider list."""
    if provider not in PROVIDERS:
        raise InputError(f"provider: expected one of {PROVIDERS}, got {brief(provider)}")  # a bad argument, as any
        # other; ProviderError says a valid provider cannot run on this machine or install
    available = ort.get_available_providers()
    if provider == "cpu":
        return [CPU]
    if provider == "cuda" and CUDA not in available:
        raise ProviderError(
            f"provider 'cuda': this onnxruntime build ({ort.__version__}, providers {available}) has no CUDA "
            "support; install the 'gpu' extra (onnxruntime-gpu) instead of 'cpu': pip uninstall onnxruntime && "
            "pip install -e '.[gpu]' in a seq2onnx checkout; or pass provider 'cpu' (--provider cpu)"
        )
    return [CUDA, CPU] if CUDA in available else [CPU]


def read_graph(model_dir: Path, file_name: str, expected_sha: str) -> bytes:
    """Read a graph's bytes, check them against the manifest's sha256, and refuse external data."""
    path = Path(model_dir) / file_name
    if not path.is_symlink() and path.resolve().parent != Path(model_dir).resolve():  # links: refused below, by name
        raise IntegrityError(f"{path}: resolves outside the model directory {model_dir}; re-export the model")
    data = read_regular_file(path, MAX_GRAPH_BYTES, IntegrityError,
                             "graph file listed in the manifest is missing; re-export the model")
    check_sha256(path, data, expected_sha, IntegrityError)
    try:
        external = external_tensor(data)
    except ValueError as exc:
        raise IntegrityError(f"{path}: not a valid ONNX protobuf ({exc}); re-export the model") from None
    if external is not None:
        raise IntegrityError(
            f"{path}: {external} keeps its data in an external file; seq2onnx graphs store every tensor inline "
            "and no file outside the graph is read, re-export the model"
        )
    return data


def external_tensor(data: bytes) -> str | None:
    """Describe the first tensor in a serialized ModelProto whose data is external, or None when all are inline."""
    stack = [("model", 0, len(data), 0)]  # (message kind, start, end, depth)
    while stack:
        kind, start, end, depth = stack.pop()
        if kind == "tensor":
            found = _external_in_tensor(data, start, end)
            if found is not None:
                return found
            continue
        if depth >= MAX_NESTING:
            raise ValueError(f"messages nested deeper than {MAX_NESTING}")
        children = SUBMESSAGES[kind]
        for number, wire, first, stop in _fields(data, start, end):
            if wire == LENGTH_DELIMITED and number in children:
                stack.append((children[number], first, stop, depth + 1))
    return None


def _external_in_tensor(data: bytes, start: int, end: int) -> str | None:
    """'tensor NAME (location LOC)' when a TensorProto has data_location EXTERNAL or external_data entries."""
    name, location, external = "", None, False
    for number, wire, first, stop in _fields(data, start, end):
        if number == TENSOR_NAME and wire == LENGTH_DELIMITED:
            name = data[first:stop].decode("utf-8", "replace")
        elif number == TENSOR_EXTERNAL_DATA and wire == LENGTH_DELIMITED:
            external = True
            entry = {n: data[a:b].decode("utf-8", "replace")
                     for n, w, a, b in _fields(data, first, stop) if w == LENGTH_DELIMITED}
            location = entry.get(2) if entry.get(1) == "location" else location  # StringStringEntryProto key=1, value=2
        elif number == TENSOR_DATA_LOCATION and wire == VARINT and first == EXTERNAL:
            external = True
    return f"tensor {brief(name)} (location {brief(location)})" if external else None


def _fields(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or payload start, payload end) for each field of data[start:end]."""
    pos = start
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _varint(data, pos, end)
            yield number, wire, value, pos
            continue
        if wire == LENGTH_DELIMITED:
            length, pos = _varint(data, pos, end)
            first, pos = pos, pos + length
        elif wire in (FIXED64, FIXED32):
            first, pos = pos, pos + (8 if wire == FIXED64 else 4)
        else:
            raise ValueError(f"unsupported wire type {wire} before byte {pos}")
        if pos > end:
            raise ValueError(f"field {number} runs past the end of its message at byte {end}")
        if wire == LENGTH_DELIMITED:
            yield number, wire, first, pos


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a base-128 varint at pos -> (value, next position)."""
    value = shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos
    raise ValueError(f"truncated or overlong varint before byte {end}")


def default_threads() -> int:
    """Intra-op threads when the caller passes None: the usable CPUs, at most DEFAULT_MAX_THREADS."""
    return min(max_threads(), DEFAULT_MAX_THREADS)


def session_options(threads: int | None, spinning: bool = SPINNING, arena: bool = ARENA) -> ort.SessionOptions:
    """seq2onnx's session settings (measured in benchmarks/cpu_step_bench.py; see the constants above)."""
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    options.intra_op_num_threads = default_threads() if threads is None else threads
    options.inter_op_num_threads = 1  # sequential execution creates no inter-op pool; 1 keeps any from spawning
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry(ALLOW_SPINNING, "1" if spinning else "0")
    for key, value in session_flag().items():  # worker threads flush denormals (runtime.denormals)
        options.add_session_config_entry(key, value)
    options.log_severity_level = 3  # keep fallback warnings out of services' logs; we check ourselves
    return options


def open_session(data: bytes, provider: str, threads: int | None, name: str,
                 device_id: int = 0, arena: bool = ARENA) -> ort.InferenceSession:
    """Create a session; a 'cuda' request that silently fell back to CPU is an error. device_id picks the GPU;
    arena: onnxruntime's CPU arena (see ARENA)."""
    device_id = check_device_id(device_id)
    providers = requested_providers(provider)
    if provider == "auto" and device_id in _CUDA_DID_NOT_START:
        providers = [CPU]  # it fell back once: every session would, each with onnxruntime's lines about it
    options = session_options(threads, arena=arena or CUDA in providers)  # CUDA keeps it: see ARENA
    provider_options = [cuda_options(device_id) if p == CUDA else {} for p in providers]
    try:
        with keeping_flags():  # onnxruntime would leave this thread flushing denormals for good
            # enable_fallback 0: onnxruntime's own fallback prints a banner on stdout (infer's results) and tries
            # again, on the CPU alone or, where TensorRT is listed, the very same providers; 'auto' falls back here
            session = ort.InferenceSession(data, sess_options=options, providers=providers,
                                           provider_options=provider_options, enable_fallback=0)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        if provider == "auto" and CUDA in providers:  # CUDA would not start: the CPU, as for a session that drops it
            _CUDA_DID_NOT_START.add(device_id)
            return open_session(data, "cpu", threads, name, device_id, arena)
        if CUDA in providers:
            raise cuda_start_error(name, providers, device_id, exc) from None
        if any(sign in str(exc) for sign in SHORT_OF):
            raise ResourceError(f"{name}: onnxruntime could not start the session: the process could not get a thread "
                                f"or memory ({one_line(exc)}); raise its limits (ulimit -u, ulimit -v), free memory or "
                                "use fewer threads (--threads 1; under ulimit -v also MALLOC_ARENA_MAX=2: each thread's "
                                "malloc arena reserves 64 MB of it) (the graph is not at fault)") from None
        raise IntegrityError(
            f"{name}: onnxruntime could not load the graph ({one_line(exc)}); re-export the model"
        ) from None
    if provider == "auto" and CUDA in providers and CUDA not in session.get_providers():
        _CUDA_DID_NOT_START.add(device_id)
    if provider == "cuda" and CUDA not in session.get_providers():
        raise ProviderError(
            f"provider 'cuda': onnxruntime-gpu is installed but CUDA could not start on CUDA device {device_id} (no "
            f"NVIDIA GPU of that ordinal, or no driver, CUDA or cuDNN libraries); the session started with "
            f"{session.get_providers()} only. Pass provider 'cpu' or 'auto' (--provider), or another device_id "
            "(infer --device-id)"
        )
    return session


def session_io(session: ort.InferenceSession) -> dict[str, dict[str, list[Any]]]:
    """A session's inputs and outputs as {name: dims}, in the manifest's format."""
    def dims(args: list[Any]) -> dict[str, list[Any]]:
        return {a.name: list(a.shape) for a in args}

    return {"inputs": dims(session.get_inputs()), "outputs": dims(session.get_outputs())}
