"""The gateway app over a lite (or mixed) backend: the gateway's own app, started and
stopped with the backend, with lite's series on /metrics and every served model on
/v1/models."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request

from llumnix.gateway import routes
from llumnix.gateway.app import build_app
from llumnix.gateway.backend import model_names
from llumnix.gateway.context import context


def lite_app(backend: Any, **app_kw: Any) -> FastAPI:
    """``build_app(backend, **app_kw)`` with lite's additions; ``backend`` has ``start`` and
    ``stop`` coroutines."""
    from llumnix.lite.metrics import install

    app = build_app(backend, **app_kw)
    app.router.on_startup.append(backend.start)
    app.router.on_shutdown.append(backend.stop)
    install(app, backend)
    # The gateway's route lists only the served model; this one, put first, answers instead.
    app.router.routes.insert(0, APIRoute("/v1/models", models, methods=["GET"]))
    return app


async def models(request: Request) -> dict[str, Any]:
    """Every model the backend serves (``model_names``), each entry shaped as the gateway's
    route shapes its one served model."""
    listing: dict[str, Any] = await routes.models(request)
    ctx = context(request)
    entry = listing["data"][0]
    listing["data"] = [entry if name == ctx.model_name else {**entry, "id": name, "root": name}
                       for name in model_names(ctx.backend)]
    return listing
