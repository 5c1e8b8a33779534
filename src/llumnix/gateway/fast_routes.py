"""The two routes nearly every request takes (chat and completions), served as plain ASGI.

FastAPI's route matching over every route, its dependency solving and its exception
middlewares cost about a third of the gateway's CPU per request (issue 30's profile).
Here the body is read and validated by the request model itself and handed to the same
route functions; whatever they raise is answered by the same handlers as FastAPI's
(``errors.HANDLERS``). A request this path does not take whole (not JSON, a body the
model refuses) goes on to FastAPI with its body replayed, so every refusal keeps the
words and status it had."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from llumnix.gateway.errors import handle

Route = tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Response]]]
"""A route's body model and its function (``routes.chat``'s signature)."""


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """FastAPI's reading: no content type, or ``application/json`` / ``*+json``."""
    for name, value in headers:
        if name == b"content-type":
            kind = value.partition(b";")[0].strip().lower()
            return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
    return False  # no content type: FastAPI's own words for it


def _replay(body: bytes, receive: Any) -> Any:
    """``receive`` with the body already read handed out first."""
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


class FastRoutes:
    def __init__(self, app: Any, routes: Mapping[str, Route]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None or not _is_json(scope["headers"]):
            await self.app(scope, receive, send)
            return
        model, endpoint = route
        request = Request(scope, receive)
        try:
            body = await request.body()
        except ClientDisconnect:
            return  # gone before its body came: nobody to answer
        except Exception as e:  # noqa: BLE001 - the body limit's 413, answered by its handler
            await (await handle(request, e))(scope, receive, send)
            return
        try:
            parsed = model.model_validate_json(body)
        except ValidationError:
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            response = await endpoint(parsed, request)
        except Exception as e:  # noqa: BLE001 - answered as FastAPI's exception handlers would
            response = await handle(request, e)
        await response(scope, receive, send)
