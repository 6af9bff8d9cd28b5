"""serving.gone.unless_gone on a real event loop: a receive that says the client went away (as uvicorn's does once
the body is read), work that ends first or last, and a server that cuts the request off."""
from __future__ import annotations

import asyncio
import sys

import pytest

from serving.gone import GONE, WATCH_AFTER_S, ClientGone, unless_gone


def receiver(after_s: float | None, asked: list[float]):
    """uvicorn's receive after the body: it returns only when the client disconnects (never, for None)."""
    async def receive() -> dict:
        asked.append(asyncio.get_running_loop().time())
        await asyncio.sleep(3600 if after_s is None else after_s)
        return {"type": "http.disconnect"}
    return receive


async def sleeper(seconds: float, ended: list[str]) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        ended.append("cancelled")  # the batcher's side: the request is given up
        raise
    ended.append("done")
    return "answer"


def test_a_request_answered_within_the_watch_delay_never_reads_receive():
    """A fast request (a batch-1 decode: ~2 ms) starts no watcher: the task it would cost is ~4 us a request."""
    async def main() -> None:
        asked: list[float] = []
        scope: dict = {}
        assert await unless_gone(sleeper(WATCH_AFTER_S / 10, []), receiver(None, asked), scope) == "answer"
        await asyncio.sleep(2 * WATCH_AFTER_S)  # the timer, had it been left, would have fired by now
        assert asked == [] and GONE not in scope
        assert len(asyncio.all_tasks()) == 1  # nothing left running
    asyncio.run(main())


def test_a_slow_request_whose_client_stays_is_answered_and_leaves_nothing_running():
    async def main() -> None:
        asked: list[float] = []
        ended: list[str] = []
        assert await unless_gone(sleeper(10 * WATCH_AFTER_S, ended), receiver(None, asked), {}) == "answer"
        assert len(asked) == 1 and ended == ["done"]
        await asyncio.sleep(0)  # the watcher's cancel lands
        assert len(asyncio.all_tasks()) == 1
    asyncio.run(main())


def test_a_client_that_goes_cancels_the_work_and_the_task_goes_on():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ended: list[str] = []
        scope: dict = {}
        started = loop.time()
        with pytest.raises(ClientGone):
            await unless_gone(sleeper(30, ended), receiver(0.05, []), scope)
        assert loop.time() - started < 5 and ended == ["cancelled"] and scope[GONE] is True
        if sys.version_info >= (3, 11):  # 3.11 counts cancels
            assert asyncio.current_task().cancelling() == 0  # its own cancel was taken back: later awaits run
        await asyncio.sleep(0.01)
    asyncio.run(main())


def test_a_server_that_cuts_the_request_off_gets_its_cancel_through():
    """The shutdown's cancel is not the client's going: it passes through as CancelledError, GONE unset."""
    async def main() -> None:
        ended: list[str] = []
        scope: dict = {}
        request = asyncio.ensure_future(unless_gone(sleeper(30, ended), receiver(None, []), scope))
        await asyncio.sleep(5 * WATCH_AFTER_S)  # the watcher is running by now
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert ended == ["cancelled"] and GONE not in scope
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == 1
    asyncio.run(main())
