"""Errors at the HTTP edge: every failure answers OpenAI's error body
``{"error": {"message", "type", "param", "code"}}``, never FastAPI's ``{"detail": ...}``."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from llumnix.core.errors import InvalidRequestError, LlumnixError, RequestFailedError, UpstreamError
from llumnix.gateway.context import context
from llumnix.policy.slo_dispatch import RequestShedError

log = logging.getLogger(__name__)


def _utf8_safe(text: str) -> str:
    """``text`` with any lone surrogate escaped: an error message may quote what the client
    sent (a model name of "\\ud800"), and its answer must still encode."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": _utf8_safe(message), "type": type_,
                      "param": None if param is None else _utf8_safe(param), "code": code}}


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_=type_, param=param, code=code), status_code=status)


def validation_message(err: dict[str, Any], content_type: str) -> tuple[str, str | None]:
    """A pydantic error as (message, the parameter it names)."""
    ctx = err.get("ctx")
    raised = ctx.get("error") if isinstance(ctx, dict) else None
    if err.get("type") == "json_invalid":  # loc is ("body", <offset>): no parameter to name
        return "request body is not valid JSON" + (f" ({raised})" if raised else ""), None
    if isinstance(raised, InvalidRequestError) and raised.param:  # a whole-body check naming its field
        return str(raised), raised.param
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if not loc and err.get("type") in ("model_attributes_type", "dict_type", "missing"):
        hint = ("" if "json" in content_type
                else f" sent as application/json (this one came as {content_type or 'no type'!r})")
        return "the request body must be a JSON object" + hint, None
    msg = str(err.get("msg", "invalid request")).removeprefix("Value error, ")  # our validators' own words
    return (f"{'.'.join(loc)}: {msg}", loc[0]) if loc else (msg, None)


async def on_invalid_body(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    err = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    context(request).reject(400)
    message, param = validation_message(err, request.headers.get("content-type", ""))
    return error_response(400, message, param=param)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"no route {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message,
                          type_="NotFoundError" if exc.status_code == 404 else "invalid_request_error")


def _from_ray(exc: BaseException) -> bool:
    return any(cls.__module__.partition(".")[0] == "ray" for cls in type(exc).__mro__)


def unwrap(exc: Exception) -> Exception:
    """The exception an actor raised, where Ray wrapped it: a ``RayTaskError(X)`` is an
    X too, but its text is the remote traceback, with source paths, pid and IP."""
    cause = getattr(exc, "cause", None) if _from_ray(exc) else None
    return cause if isinstance(cause, Exception) else exc


def public_error(exc: Exception) -> tuple[int, str, str | None]:
    """(status, message, param) to answer for ``exc``. The client sees our own one-line
    messages, or a fixed line for anything else (Ray's text carries tracebacks, paths,
    pids, IPs and actor ids): a server-side failure's detail goes to the log only."""
    inner = unwrap(exc)
    if isinstance(inner, LlumnixError) and not _from_ray(inner):  # our own words
        if isinstance(inner, InvalidRequestError):
            return 400, _first_line(inner), inner.param
        if isinstance(inner, RequestShedError):  # shed early: its class's objectives cannot be met now
            return 429, _first_line(inner), "slo_class"
        log.warning("request failed: %s: %s", type(inner).__name__, _first_line(inner))
        # The engine failed on this very request: retrying it elsewhere would fail again.
        # An engine we do not own answered badly (lite mode): a bad gateway, 502.
        status = 500 if isinstance(inner, RequestFailedError) else 502 if isinstance(inner, UpstreamError) else 503
        return status, _first_line(inner), None
    if isinstance(inner, TimeoutError):
        status, message = 503, "the cluster did not answer in time"
    elif _from_ray(inner):
        status, message = 503, "an instance or the scheduler is unavailable"
    else:
        status, message = 500, "internal server error"
    ref = uuid.uuid4().hex[:8]
    log.warning("request failed (ref %s, answered %d)", ref, status, exc_info=exc)
    return status, f"{message} (ref {ref} in the server log)", None


def _first_line(exc: Exception) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)


def failure_body(exc: Exception, during: str = "") -> tuple[int, dict[str, Any]]:
    """The status and error body for ``exc``; ``during`` leads a server-side message."""
    status, message, param = public_error(exc)
    if status >= 500:
        return status, error_body(during + message, type_="server_error")
    return status, error_body(message, param=param)


def retry_headers(exc: Exception) -> dict[str, str] | None:
    """``Retry-After`` for a shed request (429), else None."""
    inner = unwrap(exc)
    return {"Retry-After": str(inner.retry_after_s)} if isinstance(inner, RequestShedError) else None


async def on_error(_: Request, exc: Exception) -> JSONResponse:
    status, body = failure_body(exc)
    return JSONResponse(body, status_code=status, headers=retry_headers(exc))


async def on_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    context(request).reject(400)
    return await on_error(request, exc)


HANDLERS: tuple[tuple[type[Exception], Callable[[Request, Exception], Awaitable[JSONResponse]]], ...] = (
    (RequestValidationError, on_invalid_body),
    (StarletteHTTPException, on_http_error),
    (InvalidRequestError, on_invalid_request),
    (Exception, on_error))
"""Which handler answers an exception: the first whose type it is, so the most specific
(the answer FastAPI's lookup gives; ``fast_routes`` uses the same table)."""


async def handle(request: Request, exc: Exception) -> JSONResponse:
    handler = next(h for cls, h in HANDLERS if isinstance(exc, cls))
    return await handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    for cls, handler in HANDLERS:
        app.add_exception_handler(cls, handler)
