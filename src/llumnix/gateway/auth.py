"""Bearer-key checks, as a plain ASGI middleware: Starlette's ``BaseHTTPMiddleware``
(``@app.middleware``) re-wraps every request and stream and costs about a millisecond per
request, which is most of the 5 ms the gateway may add.

  /v1/*, /tokenize, /detokenize   the API key, when one is set
  /admin/* with an admin key      that key (the API key does not open them)
  /admin/* without one            drain, undrain: off (404); /admin/cluster: the API key
                                  when set, refused (403) beyond loopback when neither is
  /dashboard                      as /admin/cluster; the key may also come as ``?key=``
                                  (a browser's address bar sends no header)
  /health, /live, /metrics        open, for probes (/metrics and the API docs need the API
                                  key with ``private_docs_and_metrics``)

Keys are compared in constant time (``hmac.compare_digest``).
"""
from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse

from llumnix.gateway.context import GatewayConfig
from llumnix.gateway.errors import error_response

KEYED = ("/tokenize", "/detokenize")
"""Paths outside /v1/ that still need the API key when one is set."""
PRIVATE = ("/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
"""Paths that need the API key too with ``private_docs_and_metrics``."""
DASHBOARD = "/dashboard"
"""The live page: keyed as ``/admin/cluster``, whose view it polls."""


def _bearer(key: str | None) -> bytes | None:
    return None if key is None else f"Bearer {key}".encode()


class AuthMiddleware:
    def __init__(self, app: Any, config: GatewayConfig) -> None:
        self.app = app
        self.api_key = _bearer(config.api_key)
        self.admin_key = _bearer(config.admin_key)
        self.admin_requires_key = config.admin_requires_key
        self.keyed = KEYED + PRIVATE if config.private_docs_and_metrics else KEYED

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            rejection = self.refusal(scope["path"], scope["method"], scope["headers"], scope.get("query_string", b""))
            if rejection is not None:
                await rejection(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, path: str, method: str, headers: list[tuple[bytes, bytes]],
                query: bytes = b"") -> JSONResponse | None:
        """The answer a request gets instead of its route's, or None when it may pass."""
        page = path == DASHBOARD
        admin = page or path.startswith("/admin/")
        if not admin and (self.api_key is None or not (path.startswith("/v1/") or path in self.keyed)):
            return None
        given = dict(headers).get(b"authorization", b"")
        if page and not given:
            given = _query_key(query)
        if not admin:
            return None if _same(given, self.api_key) else _unauthorized("API key")
        if self.admin_key is not None:
            return None if _same(given, self.admin_key) else _unauthorized("admin key", page)
        if method != "GET" and not page:
            return error_response(404, f"no route {path}: the admin routes that change the cluster are off "
                                  "until the server has an admin key (--admin-key or LLUMNIX_ADMIN_KEY)",
                                  type_="NotFoundError")
        if self.api_key is None:
            if self.admin_requires_key:
                return error_response(403, "admin endpoints need --admin-key or --api-key when not on loopback",
                                      type_="permission_error")
            return None
        return None if _same(given, self.api_key) else _unauthorized("API key", page)


def _query_key(query: bytes) -> bytes:
    keys = parse_qs(query.decode("latin-1")).get("key")
    return f"Bearer {keys[0]}".encode() if keys else b""


def _same(given: bytes, key: bytes | None) -> bool:
    return key is not None and hmac.compare_digest(given, key)


def _unauthorized(what: str, page: bool = False) -> JSONResponse:
    hint = f": open {DASHBOARD}?key=KEY" if page else ""
    return error_response(401, f"missing or wrong {what}{hint}", type_="authentication_error")
