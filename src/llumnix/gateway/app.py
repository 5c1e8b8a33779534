"""The FastAPI app: the routes, the error handlers and the key checks over one backend."""
from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI

from llumnix.gateway import admin, routes
from llumnix.gateway.auth import AuthMiddleware
from llumnix.gateway.backend import Backend
from llumnix.gateway.context import GatewayConfig, GatewayContext
from llumnix.gateway.errors import install_error_handlers
from llumnix.gateway.metrics import GatewayMetrics


def build_app(backend: Backend, config: GatewayConfig | None = None, **fields: Any) -> FastAPI:
    """The gateway over ``backend``; ``fields`` override those of ``config``
    (``build_app(backend, api_key="k")``)."""
    config = dataclasses.replace(config or GatewayConfig(), **fields)
    app = FastAPI(title="Llumnix", version="0.1.0")
    app.state.gateway = GatewayContext(backend, config, GatewayMetrics(backend.model_name))
    install_error_handlers(app)
    app.add_middleware(AuthMiddleware, api_key=config.api_key, admin_requires_key=config.admin_requires_key)
    app.include_router(routes.router)
    app.include_router(admin.router)
    return app
