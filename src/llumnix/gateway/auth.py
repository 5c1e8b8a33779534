"""Bearer-key checks, as a plain ASGI middleware: Starlette's ``BaseHTTPMiddleware``
(``@app.middleware``) re-wraps every request and stream and costs about a millisecond per
request, which is most of the 5 ms the gateway may add."""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from llumnix.gateway.errors import error_response

KEYED = ("/tokenize", "/detokenize")
"""Paths outside /v1/ that still need the API key when one is set."""


def check_key(path: str, authorization: bytes, expected: bytes | None,
              admin_requires_key: bool) -> JSONResponse | None:
    """The refusal a request to ``path`` gets, or None when it may pass."""
    admin = path.startswith("/admin/")
    if admin and admin_requires_key and expected is None:
        return error_response(403, "admin endpoints need --api-key when not on loopback",
                              type_="permission_error")
    if expected is not None and (admin or path.startswith("/v1/") or path in KEYED) and authorization != expected:
        return error_response(401, "missing or wrong API key", type_="authentication_error")
    return None


class AuthMiddleware:
    def __init__(self, app: Any, api_key: str | None, admin_requires_key: bool) -> None:
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.admin_requires_key = admin_requires_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            authorization = b"" if self.expected is None else dict(scope["headers"]).get(b"authorization", b"")
            rejection = check_key(scope["path"], authorization, self.expected, self.admin_requires_key)
            if rejection is not None:
                await rejection(scope, receive, send)
                return
        await self.app(scope, receive, send)
