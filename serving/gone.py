"""A client that goes away while its request waits for a decode: the wait is given up, which the batcher reads as
no one waiting (a batch whose every request is given up stops between two steps), and the request counts as ended
without an answer. uvicorn does not cancel a request's task when its client disconnects; it says so through
`receive`, which after the body waits for exactly that."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Awaitable, TypeVar

GONE = "seq2onnx.client_gone"  # set in the request's scope when its client went away unanswered
T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready; nothing is sent."""


async def unless_gone(work: Awaitable[T], receive: Any, scope: dict[str, Any]) -> T:
    """`work`'s result, or ClientGone (and `scope[GONE]`) once the client disconnects first: `work` is cancelled."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server's shutdown cut the request off: both go with it
        task.cancel()
        watch.cancel()
        raise
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()  # the batcher marks the request given up
    with contextlib.suppress(asyncio.CancelledError):
        await task
    scope[GONE] = True
    raise ClientGone


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
