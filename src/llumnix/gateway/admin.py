"""Operators' routes: the cluster's state (read-only; with ``?after=VERSION`` a long poll
that answers when the view changes, ``cluster_watch.py``), and draining and undraining an
instance (only with an admin key: see ``auth``)."""
from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.requests import Request
from starlette.responses import JSONResponse

from llumnix.gateway.cluster_watch import TooManyWatches
from llumnix.gateway.context import context
from llumnix.gateway.errors import error_response, failure_body

reads = APIRouter()
changes = APIRouter()


async def _answer(call: Awaitable[dict[str, Any]]) -> Any:
    """The backend's answer, or its failure as an error body: handled here, since an
    exception left to the app's catch-all is answered but also re-raised to the server,
    which logs a traceback per call while LlumSched restarts. (The routes keep their dict
    response model: it writes a draining instance's infinite freeness as null.)"""
    try:
        return await call
    except TooManyWatches:
        raise
    except Exception as e:  # noqa: BLE001 - public_error logs the detail once
        status, body = failure_body(e)
        return JSONResponse(body, status_code=status)


@reads.get("/admin/cluster", response_model=dict[str, Any])
async def cluster(request: Request, after: Annotated[str | None, Query(max_length=64)] = None,
                  wait: Annotated[float, Query(ge=0.0)] = 20.0) -> Any:
    """The view now; with ``after`` (the ``version`` of the view last seen, empty for none)
    once it differs from that one, or after ``wait`` seconds (at most 30) as it is."""
    ctx = context(request)
    if after is None:
        info = await _answer(ctx.backend.cluster_info())
    else:
        try:
            info = await _answer(ctx.cluster_watch.wait(after, wait))
        except TooManyWatches as e:
            return error_response(429, str(e), type_="rate_limit_error", param="after")
        if isinstance(info, dict):
            info = {**info, "version": ctx.cluster_watch.version}
    if isinstance(info, dict):
        info = {**info, "requests": ctx.metrics.requests_summary()}  # this gateway's requests: the dashboard's rates
    return info


@changes.post("/admin/instances/{instance_id}/drain", response_model=dict[str, Any])
async def drain(instance_id: str, request: Request) -> Any:
    return await _answer(context(request).backend.drain_instance(instance_id))


@changes.post("/admin/instances/{instance_id}/undrain", response_model=dict[str, Any])
async def undrain(instance_id: str, request: Request) -> Any:
    return await _answer(context(request).backend.undrain_instance(instance_id))
