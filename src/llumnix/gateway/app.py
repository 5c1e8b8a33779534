"""The FastAPI app: the routes, the error handlers, the body limit and the key checks
over one backend; chat and completions as plain ASGI in front of FastAPI's routing."""
from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI

from llumnix.gateway import admin, routes
from llumnix.gateway.auth import AuthMiddleware
from llumnix.gateway.backend import Backend
from llumnix.gateway.context import GatewayConfig, GatewayContext
from llumnix.gateway.errors import install_error_handlers
from llumnix.gateway.fast_routes import FastRoutes
from llumnix.gateway.limits import BodyLimitMiddleware
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.gateway.protocol import ChatCompletionRequest, CompletionRequest


def build_app(backend: Backend, config: GatewayConfig | None = None, **fields: Any) -> FastAPI:
    """The gateway over ``backend``; ``fields`` override those of ``config``
    (``build_app(backend, api_key="k")``)."""
    config = dataclasses.replace(config or GatewayConfig(), **fields)
    backend.tokenizer.warm_up()
    app = FastAPI(title="Llumnix", version="0.1.0")
    app.state.gateway = GatewayContext(backend, config, GatewayMetrics(backend.model_name, backend.max_model_len))
    install_error_handlers(app)
    app.add_middleware(FastRoutes, routes={"/v1/chat/completions": (ChatCompletionRequest, routes.chat),
                                           "/v1/completions": (CompletionRequest, routes.completions)})
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes)
    app.add_middleware(AuthMiddleware, config=config)  # added last: runs first, before any body is read
    app.include_router(routes.router)
    app.include_router(admin.reads)
    if config.admin_key is not None:
        app.include_router(admin.changes)
    return app
