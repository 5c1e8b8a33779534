"""Chat and completions served as plain ASGI in front of FastAPI (``fast_routes``): a
valid request never reaches FastAPI's routing; anything the request model refuses goes
on to FastAPI with its body intact, so every refusal keeps FastAPI's answer."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llumnix.core.errors import InvalidRequestError
from llumnix.gateway.app import build_app
from llumnix.gateway.fast_routes import FastRoutes
from llumnix.gateway.protocol import ChatCompletionRequest
from tests.gateway.fake_backend import EngineBackend

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _call(app: Any, body: bytes, content_type: bytes | None = b"application/json",
          path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    """One POST through ``app`` as ASGI: (status, body)."""
    headers = [(b"content-type", content_type)] if content_type is not None else []
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b"",
             "app": None}
    chunks = [{"type": "http.request", "body": body[:5], "more_body": True},
              {"type": "http.request", "body": body[5:], "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if chunks:
            return chunks.pop(0)
        await asyncio.sleep(3600)  # no disconnect while the answer is made
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


class Inner:
    """Stands for FastAPI: records the body it is handed."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})


def _fast(endpoint: Any) -> tuple[FastRoutes, Inner]:
    inner = Inner()
    return FastRoutes(inner, {"/v1/chat/completions": (ChatCompletionRequest, endpoint)}), inner


def test_valid_request_is_served_without_the_inner_app() -> None:
    from starlette.responses import JSONResponse

    seen: list[ChatCompletionRequest] = []

    async def endpoint(body: ChatCompletionRequest, request: Any) -> JSONResponse:
        seen.append(body)
        return JSONResponse({"ok": body.max_tokens})

    fast, inner = _fast(endpoint)
    assert _call(fast, json.dumps(CHAT).encode()) == (200, b'{"ok":3}')
    assert inner.bodies == [] and seen[0].messages[0].content == "hi"


@pytest.mark.parametrize(("body", "content_type"), [
    (b'{"model": "fake", "messages": [', b"application/json"),  # not JSON
    (json.dumps({**CHAT, "max_tokens": "many"}).encode(), b"application/json"),  # refused by the model
    (json.dumps(CHAT).encode(), b"text/plain"),  # not sent as JSON
    (json.dumps(CHAT).encode(), None),  # no content type
])
def test_anything_else_reaches_the_inner_app_with_its_body(body: bytes, content_type: bytes | None) -> None:
    async def endpoint(body: Any, request: Any) -> Any:
        raise AssertionError("the endpoint must not run")

    fast, inner = _fast(endpoint)
    assert _call(fast, body, content_type) == (299, b"inner")
    assert inner.bodies == [body]


def test_other_paths_and_methods_pass_through() -> None:
    fast, inner = _fast(None)
    assert _call(fast, json.dumps(CHAT).encode(), path="/v1/completions") == (299, b"inner")


def test_an_endpoint_error_gets_the_openai_body() -> None:
    async def endpoint(body: Any, request: Any) -> Any:
        raise InvalidRequestError("temperature must be at most 2", "temperature")

    fast, _ = _fast(endpoint)
    app = build_app(EngineBackend())  # the handlers read the gateway's context
    fast.app = app

    async def via_app(scope: Any, receive: Any, send: Any) -> None:
        scope["app"] = app
        await fast(scope, receive, send)

    status, body = _call(via_app, json.dumps(CHAT).encode())
    assert status == 400
    assert json.loads(body)["error"] == {"message": "temperature must be at most 2", "type": "invalid_request_error",
                                         "param": "temperature", "code": None}


@pytest.mark.parametrize("payload", [
    b'{"model": "fake", "messages": [',
    json.dumps({**CHAT, "max_tokens": "many"}).encode(),
    json.dumps({**CHAT, "messages": []}).encode(),
    json.dumps({**CHAT, "n": 0}).encode(),
])
def test_refusals_answer_as_fastapi_does(payload: bytes) -> None:
    """The whole app: the refusal is FastAPI's 400 in OpenAI's shape, whichever path."""
    client = TestClient(build_app(EngineBackend()))
    r = client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "detail" not in r.json()
