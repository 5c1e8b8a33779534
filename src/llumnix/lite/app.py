"""The gateway app over a lite (or mixed) backend: the gateway's own app, started and
stopped with the backend, with lite's series on /metrics."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from llumnix.gateway.app import build_app


def lite_app(backend: Any, **app_kw: Any) -> FastAPI:
    """``build_app(backend, **app_kw)`` with lite's additions; ``backend`` has ``start`` and
    ``stop`` coroutines."""
    from llumnix.lite.metrics import install

    app = build_app(backend, **app_kw)
    app.router.on_startup.append(backend.start)
    app.router.on_shutdown.append(backend.stop)
    install(app, backend)
    return app

