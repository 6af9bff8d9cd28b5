"""`seq2onnx bench`, the torch-free core: grid cells, their inputs, timing, the per-call floor and the JSON record
(the tables and the plot: `runtime.bench_report`).

Every cell decodes a fixed amount of work: point models `target_len` points per source; token models exactly
`target_len` tokens per text (min_decoding_length = max_decoding_length, so </s> can end nothing early), from texts
of exactly `source_len` source tokens. The per-call floor is the median wall time of as many `session.run` calls of
a one-node Identity graph as one decode makes (encoder + one call per step): what the step loop costs before any
model arithmetic. A cell's decoders run in turn within each repeat, so drift hits all of them alike.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .declared import TokenContract
from .errors import InputError
from .spec import ModelSpec
from .token_steps import contract_for
from .tokens import encode_sources
from .vocab import JOINERS, Vocabulary

FORMAT = "seq2onnx-bench/1"  # the JSON document's "format"
LOOPS = ("step", "fused")  # the Python step loop, or the fused greedy loop graph (when the runtime and model have it)
FUSED_CALLS = 2  # run() calls of a fused decode: the encoder, then the one loop graph
# The Identity graph, written as protobuf by hand: the runtime has no onnx dependency. Field numbers from onnx.proto.
IR_VERSION, OPSET, FLOAT = 8, 17, 1
MODEL_IR, MODEL_GRAPH, MODEL_OPSET = 1, 7, 8
GRAPH_NODE, GRAPH_NAME, GRAPH_INPUT, GRAPH_OUTPUT = 1, 2, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_OP = 1, 2, 4
OPSET_VERSION = 2
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_ELEM, TENSOR_SHAPE, SHAPE_DIM, DIM_VALUE = 1, 1, 2, 1, 1
MAX_TEXT_TRIES = 50  # subword vocabularies: attempts per wanted token to grow a text to an exact token count


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _message(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string or a sub-message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _number(number: int, value: int) -> bytes:
    """A varint field."""
    return _varint(number << 3) + _varint(value)


def identity_graph() -> bytes:
    """A serialized ONNX ModelProto: y = Identity(x), x and y float32 of shape (1,)."""
    tensor = _number(TENSOR_ELEM, FLOAT) + _message(TENSOR_SHAPE, _message(SHAPE_DIM, _number(DIM_VALUE, 1)))

    def value(name: bytes) -> bytes:
        return _message(VALUE_NAME, name) + _message(VALUE_TYPE, _message(TYPE_TENSOR, tensor))

    node = _message(NODE_INPUT, b"x") + _message(NODE_OUTPUT, b"y") + _message(NODE_OP, b"Identity")
    graph = (_message(GRAPH_NODE, node) + _message(GRAPH_NAME, b"floor") + _message(GRAPH_INPUT, value(b"x"))
             + _message(GRAPH_OUTPUT, value(b"y")))
    return _number(MODEL_IR, IR_VERSION) + _message(MODEL_GRAPH, graph) + _message(MODEL_OPSET,
                                                                                   _number(OPSET_VERSION, OPSET))


@dataclass(frozen=True)
class Cell:
    """One point of the grid; `beam` is None for point models."""

    provider: str
    threads: int
    loop: str
    batch: int
    source_len: int
    target_len: int
    beam: int | None
    one_call: bool = False  # fused: the export's loop graphs read the sources (a transformer's fast graphs)

    @property
    def calls(self) -> int:
        """session.run() calls one decode makes: the encoder, then one per step (fused: one loop graph, after the
        encoder unless the graph holds it)."""
        if self.loop != "fused":
            return 1 + self.target_len
        return 1 if self.one_call else FUSED_CALLS

    def describe(self) -> str:
        """'cpu 1 thread, step loop, batch 16, source 50, target 100[, beam 5]' for progress lines."""
        beam = "" if self.beam is None else f", beam {self.beam}"
        return (f"{self.provider} {self.threads} thread{'s' * (self.threads > 1)}, {self.loop} loop, batch "
                f"{self.batch}, source {self.source_len}, target {self.target_len}{beam}")


def grid(providers: tuple[str, ...], threads: tuple[int, ...], loops: tuple[str, ...], batches: tuple[int, ...],
         sources: tuple[int, ...], targets: tuple[int, ...], beams: tuple[int | None, ...],
         beam_graph: bool = False) -> list[Cell]:
    """Every combination; the fused loop gets beam > 1 cells only where the export has a beam search graph (a
    transformer's fast graphs, which also hold the encoder: one call a decode)."""
    cells = [Cell(*values, one_call=beam_graph and values[2] == "fused")
             for values in itertools.product(providers, threads, loops, batches, sources, targets, beams)]
    return [c for c in cells if beam_graph or not (c.loop == "fused" and (c.beam or 1) > 1)]


@dataclass(frozen=True)
class Timing:
    """Wall times (seconds) of repeated calls, and the output tokens (points) the last call produced."""

    samples: tuple[float, ...]
    tokens: int = 0

    @property
    def median_s(self) -> float:
        return float(np.median(self.samples))

    @property
    def p90_s(self) -> float:
        return float(np.percentile(self.samples, 90))

    def stats(self, batch: int) -> dict[str, Any]:
        """median and p90 (ms), sequences/s and tokens/s at the median."""
        return {"median_ms": self.median_s * 1e3, "p90_ms": self.p90_s * 1e3, "sequences_per_s": batch / self.median_s,
                "tokens_per_s": self.tokens / self.median_s, "tokens": self.tokens, "repeats": len(self.samples)}


BLOCK = 5  # timed calls of one decoder in a row, per round


def measure(calls: dict[str, Callable[[], int]], warmup: int, repeats: int) -> dict[str, Timing]:
    """Time each call (it returns the tokens it produced) `repeats` times after `warmup` calls, in rounds: each
    round runs every decoder in turn, BLOCK timed calls in a row after one untimed call. Rounds share the machine's
    drift between the decoders; blocks let each run warm, as in a service, instead of measuring how much the other
    decoder evicted from the caches (one PyTorch decode in between slowed a batch-1 onnxruntime decode by half)."""
    tokens = {name: 0 for name in calls}
    for _ in range(warmup):
        for name, call in calls.items():
            tokens[name] = call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    while any(len(t) < repeats for t in times.values()):
        for name, call in calls.items():
            call()  # untimed: back in the caches after the other decoders
            for _ in range(min(BLOCK, repeats - len(times[name]))):
                start = time.perf_counter()
                tokens[name] = call()
                times[name].append(time.perf_counter() - start)
    return {name: Timing(tuple(times[name]), tokens[name]) for name in calls}


def floor_call(session: Any, calls: int) -> Callable[[], int]:
    """`calls` session.run() calls of the Identity graph, as one decode makes them."""
    feed = {"x": np.zeros(1, dtype=np.float32)}

    def run() -> int:
        for _ in range(calls):
            session.run(["y"], feed)
        return 0

    return run


@dataclass(frozen=True)
class Inputs:
    """A cell's inputs: point sources (N, Ls, F) with a full mask (N, 1, Ls), or texts of Ls tokens each."""

    source: np.ndarray | None = None
    mask: np.ndarray | None = None
    texts: tuple[str, ...] = ()


def make_inputs(spec: ModelSpec, vocab: Vocabulary | None, batch: int, source_len: int, seed: int = 0,
                contract: TokenContract | None = None) -> Inputs:
    """Seeded random inputs of exactly the cell's size (token models: `source_len` tokens of text, each source
    also holding the specials the model reads)."""
    rng = np.random.default_rng([seed, batch, source_len])
    if spec.kind == "points":
        source = rng.normal(size=(batch, source_len, spec.n_features)).astype(np.float32)  # (N, Ls, F)
        return Inputs(source=source, mask=np.ones((batch, 1, source_len), dtype=bool))  # (N, 1, Ls)
    texts = tuple(fixed_length_text(vocab, source_len, rng) for _ in range(batch))
    _, lengths = encode_sources(list(texts), vocab, spec, contract)
    rules = contract_for(spec, contract).sources
    if set(lengths.tolist()) != {source_len + rules.add_bos + rules.add_eos}:  # + the specials it reads
        raise InputError(f"source_len: texts of exactly {source_len} tokens could not be made from this vocabulary, "
                         f"got {sorted(set(lengths.tolist()))} with its specials; pass another --source-len")
    return Inputs(texts=texts)


def fixed_length_text(vocab: Vocabulary, length: int, rng: np.random.Generator) -> str:
    """A text that `vocab` splits into exactly `length` known tokens (never special, never blank)."""
    regular = [i for i, t in enumerate(vocab.tokens) if i not in vocab.ids.ids and t.strip()]  # never blank
    if not regular:
        raise InputError("vocabulary: no regular token to build benchmark texts from; the model's source vocabulary "
                         "holds only the special tokens and whitespace")
    if vocab.tokenizer in JOINERS:  # char and whitespace: one token per pick, by construction
        return JOINERS[vocab.tokenizer].join(vocab.tokens[i] for i in rng.choice(regular, size=length))
    text = ""
    for _ in range(MAX_TEXT_TRIES * length):  # subword: grow by decoded pieces until the count is exact
        piece = vocab.decode([int(rng.choice(regular))]).strip()
        candidate = f"{text} {piece}".strip()
        count = len(vocab.encode(candidate, add_eos=False)) if piece else length + 1
        if count <= length:
            text = candidate
        if count == length:
            return text
    raise InputError(f"source_len: no text of exactly {length} subword tokens was found; pass another --source-len")


def ort_call(model: Any, cell: Cell, inputs: Inputs) -> Callable[[], int]:
    """One decode of the cell's inputs through the public API; returns the output tokens (points) produced."""
    if model.spec.kind == "points":
        def points() -> int:
            return int(np.prod(model.predict(inputs.source, cell.target_len, inputs.mask).shape[:2]))
        return points

    def tokens() -> int:
        found = model.translate_batch(list(inputs.texts), beam_size=cell.beam, max_decoding_length=cell.target_len,
                                      min_decoding_length=cell.target_len)
        return sum(len(hyps[0].ids) for hyps in found)

    return tokens


def cell_record(cell: Cell, providers: list[str], timings: dict[str, Timing],
                torch_names: dict[str, str]) -> dict[str, Any]:
    """The JSON record of one cell: ort, floor and (when measured) each PyTorch decoder; speedup = torch / ort."""
    ort = timings["ort"]
    floor = timings["floor"]
    record: dict[str, Any] = {
        "provider": cell.provider, "providers": providers, "threads": cell.threads, "loop": cell.loop,
        "batch": cell.batch, "source_len": cell.source_len, "target_len": cell.target_len, "beam": cell.beam,
        "ort": ort.stats(cell.batch),
        "floor": {"calls": cell.calls, "median_ms": floor.median_s * 1e3, "p90_ms": floor.p90_s * 1e3,
                  "per_call_us": floor.median_s / cell.calls * 1e6},
        "torch": None, "speedup": None}
    for name, decoder in torch_names.items():
        record[name] = {"decoder": decoder, **timings[name].stats(cell.batch)}
    if "torch" in torch_names:
        record["speedup"] = timings["torch"].median_s / ort.median_s
    return record
