"""One loaded model behind an asyncio micro-batcher: what every server embeds (the one-process HTTP server, and each
Ray Serve replica). No Ray here.

- A bounded queue: a request that would take the waiting items past `max_queue` is refused at once (Overloaded,
  HTTP 503 with Retry-After), rather than waiting minutes behind the others.
- Batches: the first waiting request waits at most `batch_wait_ms` for company, up to `max_batch_size` items;
  then its decode runs off the event loop, in a thread of the model's, so the loop keeps accepting. Requests merge
  by `serving.batching`'s rules (sampling never merges; one bad request fails alone).
- Copies: a model loaded with `workers=N` (`serve --workers N`) decodes up to N batches at once, each whole on a
  copy of its own (`Seq2Seq.copies`); a batch is gathered when a copy is free, so under load the requests that
  arrive during the decodes under way form the next batch, as with one.
- Deadlines: a request waits at most its timeout (HTTP 408). One that gives up (timed out, or its client went
  away) while queued leaves the queue at once; when every request of a batch under way has given up, the decode
  stops (between two steps, or inside a one-call graph) and the thread takes the next batch.
"""
from __future__ import annotations

import asyncio
import functools
import math
import socket
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from runtime.errors import Cancelled, Seq2OnnxError
from runtime.model import Seq2Seq

from .batching import Decoded, decode_points, decode_texts
from .config import ServeConfig
from .jobs import PointJob, RequestTooLarge, TokenJob, point_job, token_job
from .metrics import Metrics

Job = PointJob | TokenJob
Decode = Callable[[Seq2Seq, Sequence[Any], Callable[[], bool]], list[Decoded]]


class Overloaded(Seq2OnnxError, RuntimeError):
    """The queue is full: HTTP 503, with Retry-After."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(Seq2OnnxError, TimeoutError):
    """A request not answered within its timeout: HTTP 408; its decode is stopped once no one waits for it."""


@dataclass(eq=False)  # one request is itself only: the queue removes it by identity
class Pending:
    """A request in the queue or in the decode under way: its job, the answer to come, and whether it gave up."""

    job: Job
    answer: asyncio.Future
    given_up: bool = False


class Copies:
    """The models that decode (a model's `copies`), each one batch at a time in a thread of its own, and which of
    them are free; shared by a service's batchers."""

    def __init__(self, model: Seq2Seq) -> None:
        self.models = model.copies
        self.executor = ThreadPoolExecutor(max_workers=len(self.models), thread_name_prefix="seq2onnx-decode")
        self._free: asyncio.Queue[Seq2Seq] | None = None

    async def take(self) -> Seq2Seq:
        """A free copy, once there is one."""
        if self._free is None:  # made on the event loop that serves
            self._free = asyncio.Queue()
            for model in self.models:
                self._free.put_nowait(model)
        return await self._free.get()

    def give_back(self, model: Seq2Seq) -> None:
        self._free.put_nowait(model)


@dataclass
class Batcher:
    """Requests of one kind gathered into decodes, as many at a time as `copies` has models."""

    decode: Decode
    config: ServeConfig
    copies: Copies
    metrics: Metrics
    waiting: deque[Pending] = field(default_factory=deque)
    queued_items: int = 0
    _wake: asyncio.Event | None = None
    _worker: asyncio.Task | None = None
    _decoding: set[asyncio.Task] = field(default_factory=set)

    async def submit(self, job: Job, timeout_s: float) -> Decoded:
        """Queue `job` and wait for its result (Overloaded at once when the queue is full; DeadlineExceeded after
        `timeout_s`)."""
        if job.rows > self.config.max_queue:  # it would never fit: not a matter of waiting
            field = "texts" if isinstance(job, TokenJob) else "source"
            raise RequestTooLarge(f"{field}: {job.rows} items in one request; this server queues at most "
                                  f"{self.config.max_queue} (serve --max-queue); split the request or raise "
                                  "--max-queue")
        if self.queued_items + job.rows > self.config.max_queue:
            raise Overloaded(f"this server is busy: {self.queued_items} item(s) wait already, at most "
                             f"{self.config.max_queue} may (serve --max-queue); retry shortly",
                             retry_after_s=max(1, math.ceil(self.config.batch_wait_ms / 1000)))
        pending = Pending(job, asyncio.get_running_loop().create_future())
        self._enqueue(pending)
        try:
            return await asyncio.wait_for(asyncio.shield(pending.answer), timeout_s)
        except asyncio.TimeoutError:  # TimeoutError itself from 3.11; not on 3.10
            self._give_up(pending)
            raise DeadlineExceeded(f"request: not answered within {timeout_s:g} s (serve --request-timeout); its "
                                   "decode was stopped; ask for less (fewer items, a shorter output), or retry"
                                   ) from None
        except asyncio.CancelledError:  # the client went away: no one reads the answer
            self._give_up(pending)
            raise

    def _give_up(self, pending: Pending) -> None:
        """No one waits for `pending` any more: a decode under way stops once its whole batch has given up, and one
        still queued leaves the queue now, so that it holds no place there (--max-queue, /readyz) until a copy is
        free to gather it."""
        pending.given_up = True
        try:
            self.waiting.remove(pending)
        except ValueError:  # gathered already: in a decode, or answered
            return
        self.queued_items -= pending.job.rows
        self.metrics.queue_items.dec(pending.job.rows)

    def _enqueue(self, pending: Pending) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self.waiting.append(pending)
        self.queued_items += pending.job.rows
        self.metrics.queue_items.inc(pending.job.rows)
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        """While requests wait: take a free copy, gather a batch, and decode it on that copy in its thread (answered
        when done), so that with several copies several batches decode at once."""
        loop = asyncio.get_running_loop()
        while self.waiting:
            model = await self.copies.take()
            batch = await self._gather()
            if not batch:
                self.copies.give_back(model)
                continue
            task = loop.create_task(self._decode(model, batch))
            self._decoding.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._decoding.discard)

    async def _decode(self, model: Seq2Seq, batch: list[Pending]) -> None:
        """Decode `batch` on `model` in the copies' threads, answer its requests, and free the copy."""
        items = sum(p.job.rows for p in batch)
        self.metrics.batch_items.observe(items)
        started = time.perf_counter()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.copies.executor, self.decode, model, [p.job for p in batch], _all_given_up(batch))
        except Cancelled:  # every request of the batch had given up: no one to answer
            results = [Decoded(DeadlineExceeded("request: given up"), items, len(batch))] * len(batch)
        except Exception as exc:  # a bug, not a user error (those are each request's own result)
            results = [Decoded(exc, items, len(batch))] * len(batch)
        finally:
            self.metrics.decode_seconds.observe(time.perf_counter() - started)
            self.copies.give_back(model)
        for pending, result in zip(batch, results):
            if not pending.answer.done():
                pending.answer.set_result(result)

    async def _gather(self) -> list[Pending]:
        """The next batch: the first waiting request and whoever arrives within batch_wait_ms, up to
        max_batch_size items."""
        deadline = time.monotonic() + self.config.batch_wait_ms / 1000
        while self._items_waiting() < self.config.max_batch_size and time.monotonic() < deadline:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:  # TimeoutError itself from 3.11; not on 3.10
                break
        batch, items = [], 0
        while self.waiting and items + self.waiting[0].job.rows <= self.config.max_batch_size:
            pending = self.waiting.popleft()  # (one that gave up has left the queue already: _give_up)
            self.queued_items -= pending.job.rows
            self.metrics.queue_items.dec(pending.job.rows)
            batch.append(pending)
            items += pending.job.rows
        return batch

    def _items_waiting(self) -> int:
        return self.queued_items


OFF_THE_LOOP_POINTS = 4096  # a source this large takes milliseconds to check and convert: done in a thread
OFF_THE_LOOP_THREADS = 2  # the service's own threads for that (and for parsing large bodies: serving.front)


def _points_in(source: Any) -> int:
    """About how many points a request's source (lists, as JSON gives them) holds: rows x the first row's length."""
    if isinstance(source, list) and source and isinstance(source[0], list):
        return len(source) * len(source[0])
    return 0


class Service:
    """The model, its two batchers (points and texts, sharing the model's copies: one decode at a time on each),
    the server's bounds and its metrics."""

    def __init__(self, model: Seq2Seq, config: ServeConfig, name: str, node: str | None = None,
                 metrics: Metrics | None = None) -> None:
        self.model, self.config, self.name = model, config, name
        self.node = node or socket.gethostname()  # the machine (a Ray replica: its node id)
        self.metrics = metrics or Metrics()
        self.copies = Copies(model)
        self.off_loop_pool = ThreadPoolExecutor(OFF_THE_LOOP_THREADS, thread_name_prefix="seq2onnx-parse")
        self.points = Batcher(decode_points, config, self.copies, self.metrics)
        self.texts = Batcher(decode_texts, config, self.copies, self.metrics)

    @property
    def ready(self) -> bool:
        """Loaded, and the queue has room."""
        return self.points.queued_items + self.texts.queued_items < self.config.max_queue

    async def predict(self, source: Any, source_mask: Any, target_len: int | None, attention: bool = True) -> Decoded:
        check = functools.partial(point_job, self.model, source, source_mask, target_len,
                                  self.config.max_batch_size, self.config.max_decoding_length, attention)
        job = await self.off_loop(check) if _points_in(source) > OFF_THE_LOOP_POINTS else check()
        return await self.points.submit(job, self.config.request_timeout_s)

    async def translate(self, texts: Any, options: dict[str, Any]) -> Decoded:
        job = token_job(self.model, texts, options, self.config.max_batch_size, self.config.max_decoding_length,
                        self.config.max_beam_size)
        return await self.texts.submit(job, self.config.request_timeout_s)

    async def off_loop(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)` in the service's own threads, while the loop serves others. Not asyncio's default executor
        (`asyncio.to_thread`): the loop's shutdown starts a new thread to join that one, which a process at its
        memory limit (`ulimit -v`, its address space held by the decodes' arenas) could not, and the graceful stop
        ended in a traceback, exit 1."""
        return await asyncio.get_running_loop().run_in_executor(self.off_loop_pool, functools.partial(call, *args))

    def close(self) -> None:
        """Stop the decode threads once what they hold is done, and the threads that parse off the loop."""
        self.copies.executor.shutdown(wait=True, cancel_futures=True)
        self.off_loop_pool.shutdown(wait=True, cancel_futures=True)


def _all_given_up(batch: list[Pending]) -> Callable[[], bool]:
    """A decode's `cancel`: stop once no request of its batch waits for the answer."""
    return lambda: all(pending.given_up for pending in batch)


# The one service of a process that serves through an app it did not build: Ray Serve hands each replica its own
# copy of the ingress app, after the replica's __init__ has run, so the replica cannot attach to that copy.
_PROCESS_SERVICE: list[Service] = []


def serve_in_this_process(service: Service) -> None:
    """Make `service` the answer of every app of this process that has none attached (a Ray replica's)."""
    _PROCESS_SERVICE[:] = [service]


def service_of(app: Any) -> Service | None:
    """The service `app` serves: the one attached to it, else this process's."""
    attached = getattr(getattr(app, "state", None), "service", None)
    return attached if attached is not None else next(iter(_PROCESS_SERVICE), None)
