"""llama-cpp-python's OpenAI server with one more route, ``GET /health`` (200 once the
model is loaded): sglang-router admits only workers that answer it, and llama-cpp-python's
server (0.3.36) has none (llama.cpp's own C++ server does). The same engine and every
other route unchanged. Runs under the llama.cpp virtualenv, not ours:

    /work/venvs/llamacpp/bin/python benchmarks/lite/llamacpp_server.py --model M --port P [its flags]
"""
from __future__ import annotations

from typing import Any

import llama_cpp.server.__main__ as server  # type: ignore[import-not-found]

_create_app = server.create_app


def create_app(**kw: Any) -> Any:
    app = _create_app(**kw)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


server.create_app = create_app  # main() builds its app through this name

if __name__ == "__main__":
    server.main()
