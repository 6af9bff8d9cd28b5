"""A client that goes away while its request waits for a decode: the wait is given up, which the batcher reads as
no one waiting (a batch whose every request is given up stops between two steps), and the request counts as ended
without an answer. uvicorn does not cancel a request's task when its client disconnects; it says so through
`receive`, which after the body waits for exactly that."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

GONE = "seq2onnx.client_gone"  # set in the request's scope when its client went away unanswered
T = TypeVar("T")
WATCH_AFTER_S = 0.01  # a request answered within this is not watched: its client, gone or not, costs nothing more


class ClientGone(Exception):
    """The client disconnected before its answer was ready; nothing is sent."""


async def unless_gone(work: Awaitable[T], receive: Any, scope: dict[str, Any]) -> T:
    """`work`'s result, or ClientGone (and `scope[GONE]`) once the client disconnects first: `work` is cancelled.
    `work` runs in the caller's task. A watcher task, started once `work` has taken WATCH_AFTER_S, waits on
    `receive` and cancels that task if the client goes; a request answered sooner is not watched (a task a request
    cost ~11 us, and a second one for `work` with an `asyncio.wait` ~23 us)."""
    task = asyncio.current_task()
    assert task is not None, "unless_gone runs inside a task"
    gone = False
    watcher: asyncio.Future[None] | None = None

    async def watch() -> None:
        nonlocal gone
        await _disconnected(receive)
        gone = True
        task.cancel()  # the batcher marks the request given up

    def start() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:  # the server's shutdown cut the request off
            raise
        if hasattr(task, "uncancel"):  # Python 3.11+ counts cancels: ours is answered here, the task goes on
            task.uncancel()
        scope[GONE] = True
        raise ClientGone from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
