"""A client that leaves stops its response's work: a stream's generator is closed (its
requests aborted) and a whole answer's work is cancelled (499), with no second task doing
the work; a server stopping still cancels through."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llumnix.gateway.disconnect import ClientWatch
from llumnix.gateway.streaming import EventStream


def _client(leave_after_s: float | None) -> Any:
    async def receive() -> dict[str, Any]:
        if leave_after_s is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(leave_after_s or 0)
        return {"type": "http.disconnect"}
    return receive


def test_a_stream_stops_when_its_client_leaves() -> None:
    closed: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def body():
        try:
            while True:
                yield b"data: x\n\n"
                await asyncio.sleep(0.01)
        finally:
            closed.append(True)  # where run_choice aborts the request

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    async def main() -> None:
        await asyncio.wait_for(EventStream(body())({"type": "http"}, _client(0.05), send), 2)

    asyncio.run(main())
    assert closed == [True] and sent[0]["type"] == "http.response.start"
    assert 2 <= len(sent) < 20 and not any(m.get("more_body") is False for m in sent)


def test_a_finished_stream_ends_with_an_empty_last_body() -> None:
    sent: list[dict[str, Any]] = []

    async def body():
        for _ in range(3):
            yield b"data: x\n\n"

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    asyncio.run(EventStream(body())({"type": "http"}, _client(None), send))
    assert [m.get("body") for m in sent[1:]] == [b"data: x\n\n"] * 3 + [b""]
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")


def test_work_is_cancelled_when_the_client_leaves_and_the_task_goes_on() -> None:
    async def main() -> tuple[bool, bool]:
        cancelled = False
        with ClientWatch(_client(0.02)) as client:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled = True
                raise
        await asyncio.sleep(0)  # the task was uncancelled: it may await again
        return cancelled, client.left

    assert asyncio.run(asyncio.wait_for(main(), 2)) == (True, True)


def test_a_server_stopping_still_cancels_through() -> None:
    async def main() -> None:
        async def work() -> None:
            with ClientWatch(_client(None)):
                await asyncio.sleep(10)
        t = asyncio.ensure_future(work())
        await asyncio.sleep(0.01)
        t.cancel()
        await t

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_finished_work_is_not_cancelled_by_a_late_disconnect() -> None:
    async def main() -> bool:
        with ClientWatch(_client(0.0)) as client:
            pass
        await asyncio.sleep(0.02)  # the disconnect arrives after the block
        return client.left

    assert asyncio.run(main()) is False
