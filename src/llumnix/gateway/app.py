"""The FastAPI app: the routes, the error handlers, the body limit and the key checks
over one backend; chat and completions as plain ASGI in front of FastAPI, its routing and
its middleware stack."""
from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI

from llumnix.gateway import admin, dashboard, routes
from llumnix.gateway.auth import AuthMiddleware
from llumnix.gateway.backend import Backend
from llumnix.gateway.context import GatewayConfig, GatewayContext
from llumnix.gateway.errors import install_error_handlers
from llumnix.gateway.fast_routes import FastRoutes
from llumnix.gateway.limits import BodyLimitMiddleware, body_limit
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.gateway.protocol import ChatCompletionRequest, CompletionRequest


def build_app(backend: Backend, config: GatewayConfig | None = None, **fields: Any) -> FastAPI:
    """The gateway over ``backend``; ``fields`` override those of ``config``
    (``build_app(backend, api_key="k")``)."""
    config = dataclasses.replace(config or GatewayConfig(), **fields)
    backend.tokenizer.warm_up()
    app = GatewayApp(title="Llumnix", version="0.1.0")
    app.state.gateway = ctx = GatewayContext(backend, config, GatewayMetrics(backend.model_name, backend.max_model_len))
    app.router.on_shutdown.append(ctx.cluster_watch.close)  # its refresher, when no connection was open
    install_error_handlers(app)
    max_bytes = body_limit(config.max_request_bytes, backend.max_model_len)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes)
    app.add_middleware(AuthMiddleware, config=config)  # added last: runs first, before any body is read
    fast = FastRoutes(app.stack, {"/v1/chat/completions": (ChatCompletionRequest, routes.chat),
                                  "/v1/completions": (CompletionRequest, routes.completions)})
    app.fast_paths = frozenset(fast.routes)
    app.fast = AuthMiddleware(BodyLimitMiddleware(fast, max_bytes=max_bytes), config=config)
    app.include_router(routes.router)
    app.include_router(admin.reads)
    app.include_router(dashboard.router)
    if config.admin_key is not None:
        app.include_router(admin.changes)
    return app


class GatewayApp(FastAPI):
    """FastAPI, with chat and completions taken before its middleware stack: FastAPI's
    own layers (server errors, its telemetry, its body limit, exceptions, an exit stack)
    wrap every message of a stream and cost more than the route's own work at one token
    (issue 34's added latency). Those two routes get the same key check and body limit;
    ``FastRoutes`` answers their errors with the same handlers, and hands a body it does
    not take (not JSON, refused by the model) to the whole stack, where the routes and
    handlers answer it as before."""

    fast: Any = None
    fast_paths: frozenset[str] = frozenset()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in self.fast_paths and scope["method"] == "POST":
            scope["app"] = self
            await self.fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def stack(self, scope: Any, receive: Any, send: Any) -> None:
        """The whole app, middleware and routing: where ``FastRoutes`` sends what it does not take."""
        await super().__call__(scope, receive, send)
