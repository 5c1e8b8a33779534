"""The request body limit, as a plain ASGI middleware: a body larger than the limit gets
a 413 before it is parsed, whether it declares its length (Content-Length: refused
before a byte of it is read) or comes in chunks (refused as soon as the count passes)."""
from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from llumnix.gateway.errors import error_response

AUTO_BYTES_PER_TOKEN = 64
"""``--max-request-bytes auto``: this many bytes per token of context (JSON-escaped text
runs 4-24 bytes a token, token ids 2-8)..."""
AUTO_MIN_BYTES = 512 << 10
"""...and never less than this. Validating a body holds the GIL for up to ~0.12 ms per KiB
(a chat of empty messages, the costliest shape) on a 2-core VM: 512 KiB is ~60 ms of a
stalled event loop at worst, where 8 MiB was a second."""


def body_limit(setting: int | str | None, max_model_len: int) -> int | None:
    """The request body limit in bytes: a number, None (no limit), or 'auto' (from the context)."""
    if setting == "auto":
        return max(AUTO_MIN_BYTES, AUTO_BYTES_PER_TOKEN * max_model_len)
    assert setting is None or isinstance(setting, int)
    return setting


def _too_large(limit: int) -> str:
    return f"the request body is larger than this server's limit of {limit} bytes (--max-request-bytes)"


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int | None) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        limit = self.max_bytes
        if scope["type"] != "http" or limit is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await error_response(413, _too_large(limit))(scope, receive, send)
            return
        received = 0

        async def counted() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # FastAPI lets an HTTPException out of its body reading; the app's
                    # handler then answers it in OpenAI's error shape.
                    raise HTTPException(413, _too_large(limit))
            return message

        await self.app(scope, counted, send)
