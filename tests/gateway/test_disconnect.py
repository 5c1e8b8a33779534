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


def test_a_streams_tail_is_the_bodys_end_in_one_write() -> None:
    from llumnix.gateway.streaming import Tail

    sent: list[dict[str, Any]] = []

    async def body():
        yield b"data: x\n\n"
        yield Tail(b"data: y\n\ndata: [DONE]\n\n")

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    asyncio.run(EventStream(body())({"type": "http"}, _client(None), send))
    assert [(m.get("body"), m.get("more_body")) for m in sent[1:]] == [
        (b"data: x\n\n", True), (b"data: y\n\ndata: [DONE]\n\n", False)]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_finished_streams_last_chunk_usage_and_done_go_out_as_one_write(include_usage: bool) -> None:
    """Through the app: the finishing chunk, the usage (when asked for) and ``[DONE]`` are
    the body's last message, not three more writes after it."""
    import json

    from llumnix.gateway.app import build_app
    from tests.gateway.fake_backend import EngineBackend

    app = build_app(EngineBackend())
    body = json.dumps({"model": "fake", "prompt": "abc", "max_tokens": 3, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": include_usage}}).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "root_path": ""}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert [m["more_body"] for m in bodies] == [True, True, False]  # two tokens, then the tail
    events = bodies[-1]["body"].split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]"
    last = json.loads(events[0][6:])
    assert last["choices"][0]["finish_reason"] == "length"
    assert len(events) == (3 if include_usage else 2)
    if include_usage:
        assert json.loads(events[1][6:])["usage"]["completion_tokens"] == 3
