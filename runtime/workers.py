"""Data-parallel decoding (`Seq2Seq.load(workers=N)`): a call of many rows is split into contiguous chunks of its
inputs, decoded at once by N copies of the sessions (one on the calling thread, the others on a pool of N - 1
threads), and joined in order: CTranslate2's inter_threads. Each copy has its own sessions, so their allocators do
not contend (the wide greedy graph at batch 64 in two halves at once: 0.90x the one-thread time on one session, 0.67x
on two; a scratch comparison on the 2-core Xeon VM of the README's workers figures).

A chunk keeps the whole call's padding width, starts on a block of the wide greedy loop and is decoded by the graph
the whole call would use, so a float32 or float16 export returns exactly what one copy returns for the whole call.
An int8 export never splits a call: it quantizes activations per call, over the call's rows, and a split changed
results (the 1-epoch dates transformer: 4-6.5% of hypotheses other ids, scores up to 0.17 apart; int8 squares:
outputs up to 0.125 apart)."""
from __future__ import annotations

import numbers
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, TypeVar

from .errors import InputError, brief, int_text
from .sessions import max_threads

# Rows (inputs x beams) each chunk must hold. Short bursts on two threads did not run side by side on the 2-core
# Xeon VM (numpy products split over two threads: 1.43x the serial time for 0.6 ms of work, 0.66x for 16 ms), so
# short calls run whole: 2 workers took 0.61x-0.72x the time of one at 64 rows (the dates transformer, greedy and
# beam 5, batch 64) and 0.9-1.3x at 8-16 rows.
SPLIT_ROWS = 32
# Chunks start at multiples of this many inputs: the wide greedy loop decodes inputs in blocks of 4
# (export.tokens.fast.GROUP), and a chunk that starts inside a block regroups the rest, which moves float32 sums.
ALIGN = 4

C = TypeVar("C")
R = TypeVar("R")


def check_workers(workers: Any, threads: int | None) -> int:
    """`workers` as an int >= 1 whose threads (workers x intra-op threads each) fit the CPUs this process may use."""
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise InputError(f"workers: expected a positive int, got {brief(workers)}")
    workers, cpus = int(workers), max_threads()
    if workers * (threads or 1) > cpus:
        each = f" of {threads} intra-op threads each" if threads and threads > 1 else ""
        raise InputError(f"workers: {int_text(workers)} workers{each} need {int_text(workers * (threads or 1))} "
                         f"CPUs, more than the {cpus} this process may use; pass workers x threads <= {cpus}")
    return workers


class Workers(Generic[C]):
    """`copies` (the caller's own first) and the threads that run the others' chunks."""

    def __init__(self, copies: list[C]) -> None:
        self.copies = copies
        self._pool = (ThreadPoolExecutor(len(copies) - 1, thread_name_prefix="seq2onnx-worker")
                      if len(copies) > 1 else None)

    def mapped(self, of: Callable[[C], Any]) -> Workers[Any]:
        """The same threads over `of(copy)` of each copy (a model's token steps, say)."""
        view: Workers[Any] = Workers([])
        view.copies, view._pool = [of(copy) for copy in self.copies], self._pool
        return view

    def chunks(self, inputs: int, rows_each: int = 1, graph: Callable[[int], object] | None = None) -> list[slice]:
        """Contiguous slices of `inputs` inputs of `rows_each` rows, one per copy at most, each starting at a
        multiple of ALIGN inputs and holding at least SPLIT_ROWS rows, and (`graph`: the graph that decodes that many
        inputs) each decoded by the whole call's graph, so the split call returns what the whole call returns on
        one copy. One slice, the whole call, where no split meets that."""
        for n in range(min(len(self.copies), inputs * rows_each // SPLIT_ROWS), 1, -1):
            bounds = [0, *(inputs * i // n // ALIGN * ALIGN for i in range(1, n)), inputs]
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
            if min(sizes) * rows_each < SPLIT_ROWS:
                continue
            if graph is not None and {graph(size) for size in set(sizes)} != {graph(inputs)}:
                continue
            return [slice(a, b) for a, b in zip(bounds, bounds[1:])]
        return [slice(0, inputs)]

    def run(self, parts: list[slice], decode: Callable[[C, slice], R]) -> list[R]:
        """decode(copy, part) for each part, the first on this thread; every part finishes before this returns
        (a failed or cancelled one included), and the first part's error in order is raised."""
        if len(parts) == 1 or self._pool is None:
            return [decode(self.copies[0], part) for part in parts]
        futures: list[Future[R]] = [self._pool.submit(decode, copy, part)
                                    for copy, part in zip(self.copies[1:], parts[1:])]
        try:
            first = decode(self.copies[0], parts[0])
        finally:
            for future in futures:
                future.exception()  # waits: nothing of this call runs on after it returns or raises
        return [first, *(future.result() for future in futures)]
