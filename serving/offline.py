"""Offline batch decoding on Ray Data (`infer --ray`): one loaded model per actor, JSON lines back in input order.

The driver cuts the rows into blocks (token models: of whole --batch-size chunks); `map_batches` hands each block to
an actor of a fixed pool, and the driver reads the JSON lines back block by block (`cli.infer_ray` writes them).
Each actor sorts its block by source length, decodes sub-batches of --batch-size, and returns the rows in their
input order; Ray Data's `preserve_order` keeps the blocks in order, and the driver checks that "index" rises.
Sampling keeps the in-process chunks (--batch-size consecutive inputs, seeded by their number), unsorted, so a seeded
run draws exactly what `infer` without --ray draws. So does an int8 export, which quantizes its activations per
call, over the call's rows: sorted sub-batches changed 2 of 300 dates' ids and scores by up to 2.5e-3. An int8 point
model's rows go as one block, as `infer` decodes them in one call (`whole_calls`)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import ray
import ray.data

from runtime.decode_options import samples
from runtime.defaults import INT8
from runtime.infer_records import json_line, record
from runtime.infer_tokens import Item, batch_seed, batches, source_columns
from runtime.model import Seq2Seq

BLOCKS_PER_ACTOR = 4  # several blocks per actor even out uneven blocks; more only add per-block overhead
MAX_TOKEN_BLOCK = 2048  # rows sorted together: big enough to group similar lengths, small enough to stream
MAX_POINT_BLOCK = 256  # point sources are already padded to one length: blocks only spread the work


class OrderError(RuntimeError):
    """Rows came back out of input order (Ray Data's preserve_order was not honoured)."""


@dataclass(frozen=True)
class Plan:
    """What every actor needs: the model, how to run it, and how to decode."""

    model_dir: str | None  # None: the actor's working directory, where `ray.init(runtime_env=...)` shipped it
    provider: str = "auto"
    threads: int = 1  # onnxruntime intra-op threads = the CPUs each actor reserves
    fused: bool = True
    batch_size: int = 32
    options: dict[str, Any] = field(default_factory=dict)  # translate_batch's keywords (token models)
    attention: bool = False
    target_len: int | None = None  # point models

    @property
    def sampling(self) -> bool:
        """True when tokens are drawn at random, so chunks must stay as in-process infer cuts them."""
        o = self.options
        return samples(o.get("sampling_topk", 1))

    @property
    def gpus(self) -> int:
        """GPUs each actor reserves: one where the sessions must run on CUDA."""
        return 1 if self.provider == "cuda" else 0


def load(plan: Plan) -> Seq2Seq:
    """The actor's model: from plan.model_dir, or its working directory when the model was shipped there."""
    return Seq2Seq.load(plan.model_dir or os.getcwd(), provider=plan.provider, threads=plan.threads,
                        fused=plan.fused)


class TokenDecoder:
    """A Ray Data actor holding one loaded token model; a block of rows in, their JSON lines out."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.model = load(plan)
        self.vocab = self.model.vocabularies["source"]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        index, texts = batch["index"], [str(t) for t in batch["text"]]
        lines = np.empty(len(texts), dtype=object)
        options = {**self.plan.options, "return_attention": self.plan.attention}
        rules = self.model.contract.sources
        for rows, number in self.groups(texts, batch["chunk"]):
            seed = batch_seed(options["seed"], number) if number is not None else options["seed"]
            found = self.model.translate_batch([texts[r] for r in rows], **{**options, "seed": seed})
            for r, hyps in zip(rows, found):
                columns = source_columns(self.vocab, texts[r], rules) if self.plan.attention else None
                lines[r] = json_line(record(Item(int(index[r]), texts[r], ""), hyps, columns))
        return {"index": index, "line": lines}

    def groups(self, texts: list[str], chunks: np.ndarray) -> Iterator[tuple[list[int], int | None]]:
        """Row groups to decode together: in-process chunks (with their number) when sampling or for an int8
        export, else --batch-size rows of similar length (shortest first), so little of each batch is padding."""
        if self.plan.sampling or whole_calls(self.model):
            for number in dict.fromkeys(chunks.tolist()):
                yield np.flatnonzero(chunks == number).tolist(), number
            return
        lengths = [len(self.vocab.encode(t, add_eos=True)) for t in texts]
        order = sorted(range(len(texts)), key=lambda r: (lengths[r], r))
        size = self.plan.batch_size
        for start in range(0, len(order), size):
            yield order[start:start + size], None


class PointDecoder:
    """A Ray Data actor holding one loaded point model; a block of rows in, their JSON lines out."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.model = load(plan)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        found = self.model.predict(batch["source"], target_len=self.plan.target_len, source_mask=batch["mask"],
                                   return_attention=self.plan.attention)
        outputs, alphas = found if self.plan.attention else (found, None)
        keep = alphas is not None
        lines = np.array([json.dumps({"index": int(i), "outputs": outputs[k].tolist(),
                                      **({"attention": alphas[k].tolist()} if keep else {})})
                          for k, i in enumerate(batch["index"])], dtype=object)
        return {"index": batch["index"], "line": lines}


def whole_calls(model: Seq2Seq) -> bool:
    """Whether rows must be decoded in the calls in-process `infer` makes: an int8 export's results depend on the
    rows decoded beside them (its activations are quantized per call)."""
    return model.manifest.precision == INT8


def block_rows(n: int, actors: int, unit: int, most: int) -> int:
    """Rows per block: about BLOCKS_PER_ACTOR blocks per actor, at most `most`, a multiple of `unit`."""
    rows = min(max(math.ceil(n / (actors * BLOCKS_PER_ACTOR)), unit), max(most, unit))
    return math.ceil(rows / unit) * unit


def token_dataset(chunks: list[list[Item]], rows: int) -> ray.data.Dataset:
    """Blocks of `rows` rows (whole chunks): the index, text and in-process chunk number of each input."""
    flat = [(item.index, item.text, number) for number, chunk in enumerate(chunks) for item in chunk]
    return ray.data.from_arrow([pa.table({"index": pa.array([r[0] for r in part], pa.int64()),
                                          "text": [r[1] for r in part],
                                          "chunk": pa.array([r[2] for r in part], pa.int64())})
                                for part in (flat[start:start + rows] for start in range(0, len(flat), rows))])


def point_dataset(source: np.ndarray, mask: np.ndarray, rows: int) -> ray.data.Dataset:
    """Blocks of about `rows` rows: the index, (L, F) source and (1, L) mask of each item."""
    items = [{"index": i, "source": source[i], "mask": mask[i]} for i in range(len(source))]
    return ray.data.from_items(items, override_num_blocks=math.ceil(len(items) / rows))


def decode(dataset: ray.data.Dataset, decoder: type, plan: Plan, actors: int, rows: int) -> Iterator[str]:
    """The JSON lines of every row, in input order (checked), each ending in a newline."""
    dataset.context.execution_options.preserve_order = True
    decoded = dataset.map_batches(decoder, fn_constructor_kwargs={"plan": plan},
                                  compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=plan.threads,
                                  num_gpus=plan.gpus or None, batch_size=rows, batch_format="numpy")
    previous = -1
    for batch in decoded.iter_batches(batch_size=None, batch_format="numpy"):
        for index, line in zip(batch["index"].tolist(), batch["line"]):
            if index <= previous:
                raise OrderError(f"row {index} came after row {previous}; Ray Data did not preserve the order")
            previous = index
            yield line + "\n"


def decode_rows(n: int, make: Callable[[int], ray.data.Dataset], decoder: type, plan: Plan, actors: int,
                unit: int, most: int) -> tuple[int, Iterator[str]]:
    """(actors used, the JSON lines) of `n` rows that `make(rows per block)` cuts into blocks; an actor that would
    get no block is not started."""
    rows = block_rows(n, actors, unit, most)
    actors = min(actors, math.ceil(n / rows))
    return actors, decode(make(rows), decoder, plan, actors, rows)


def decode_texts(texts: list[str], plan: Plan, actors: int | None = None) -> list[str]:
    """Python API, on the Ray this process is connected to: the JSON line of each non-blank text, in order. A text
    too long for the model is refused as `infer` refuses it (a click.ClickException naming texts[i])."""
    model = Seq2Seq.load(plan.model_dir, provider="cpu", fused=plan.fused)
    chunks = list(batches((Item(i, t, f"texts[{i}]") for i, t in enumerate(texts)), plan.batch_size,
                          model.vocabularies["source"], [], model.spec, model.contract))
    make = partial(token_dataset, chunks)
    n = sum(map(len, chunks))
    return list(decode_rows(n, make, TokenDecoder, plan, actors or cluster_actors(plan), plan.batch_size,
                            MAX_TOKEN_BLOCK)[1])


def cluster_actors(plan: Plan) -> int:
    """The default pool: one actor per `plan.threads` CPUs of the cluster (and per GPU where CUDA is asked for)."""
    resources = ray.cluster_resources()
    actors = int(resources.get("CPU", 1) // plan.threads)
    if plan.gpus:
        actors = min(actors, int(resources.get("GPU", 0)))
    return max(actors, 1)
