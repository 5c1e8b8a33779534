"""llama-cpp-python's OpenAI server, with two routes that do not wait for the model:

* ``GET /health`` (200 once the model is loaded): sglang-router admits only workers that
  answer it, and llama-cpp-python's server (0.3.36) has none (llama.cpp's own C++ server
  does);
* ``GET /v1/models``, the same body as the server's own, but without taking the model's
  lock: the server's route waits for the lock, so a router's probe waits behind the whole
  generation in progress (and every request queued for it) and times out, and with
  ``--interrupt_requests True`` (its default) any request that waits for the lock, a probe
  included, cuts the request streaming at that moment short with a ``[DONE]`` before its
  finish reason. The benchmark runs the servers with ``--interrupt_requests False``: one
  request at a time, the others queued, none cut short.

The same engine and every other route unchanged. Runs under the llama.cpp virtualenv, not ours:

    /work/venvs/llamacpp/bin/python benchmarks/lite/llamacpp_server.py --model M --port P [its flags]
"""
from __future__ import annotations

from typing import Any

import llama_cpp.server.__main__ as server  # type: ignore[import-not-found]

_create_app = server.create_app


def create_app(**kw: Any) -> Any:
    from llama_cpp.server import app as app_module  # type: ignore[import-not-found]

    app = _create_app(**kw)
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/v1/models"]

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        proxy = app_module._llama_proxy
        return {"object": "list", "data": [{"id": alias, "object": "model", "owned_by": "me", "permissions": []}
                                           for alias in proxy]}

    return app


server.create_app = create_app  # main() builds its app through this name

if __name__ == "__main__":
    server.main()
