"""Errors at the HTTP edge: every failure answers OpenAI's error body
``{"error": {"message", "type", "param", "code"}}``, never FastAPI's ``{"detail": ...}``."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from llumnix.core.errors import InvalidRequestError, LlumnixError
from llumnix.gateway.context import context

log = logging.getLogger(__name__)


def error_body(message: str, *, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


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


async def on_invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequestError)
    context(request).reject(400)
    return error_response(400, str(exc), param=exc.param)


async def on_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return error_response(503, str(exc), type_="server_error")


async def on_internal(_: Request, exc: Exception) -> JSONResponse:
    # A dead or restarting actor behind an admin call: one clear line, no traceback.
    log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return error_response(503 if isinstance(exc, TimeoutError) else 500,
                          f"{type(exc).__name__}: {exc}", type_="server_error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, on_invalid_body)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(InvalidRequestError, on_invalid_request)
    app.add_exception_handler(LlumnixError, on_unavailable)
    app.add_exception_handler(Exception, on_internal)
