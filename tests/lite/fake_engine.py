"""A small OpenAI-compatible engine for lite-mode tests: a real HTTP server (aiohttp, in
a thread of its own) whose answers a test chooses: stream words, refuse with a 500,
hang, stream garbage, or break off mid-stream."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

from aiohttp import web

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def expected_text(n: int) -> str:
    """What the engine streams for ``max_tokens=n`` (one word a chunk)."""
    return "".join(f" {WORDS[i % len(WORDS)]}" for i in range(n))


class FakeEngine:
    """``mode``: ok | error500 | hang | garbage | break_after:K (K chunks, then the
    connection drops) | hang_after:K. ``delay_s`` between chunks. ``metrics``: a vLLM page
    or None (404)."""

    def __init__(self, mode: str = "ok", delay_s: float = 0.0, model: str = "fake-model",
                 metrics: str | None = None, models: tuple[str, ...] = ()) -> None:
        self.mode, self.delay_s, self.model, self.metrics = mode, delay_s, model, metrics
        self.models = (model, *models)
        """What /v1/models lists; a completion naming another model gets vLLM's 404."""
        self.prompts: list[Any] = []
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        """Each completion request's Authorization header (None: none sent)."""
        self.num_in_flight = 0
        self.max_in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    # -- handlers -------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        if self.mode == "error500":
            return web.Response(status=500, text="broken")
        return web.json_response({"object": "list", "data": [{"id": m, "max_model_len": 4096} for m in self.models]})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            return web.Response(status=404)
        return web.Response(text=self.metrics)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        self.prompts.append(body["prompt"])
        mode = self.mode
        if mode == "error500":
            return web.json_response({"error": {"message": "engine on fire"}}, status=500)
        if body.get("model") not in self.models:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "param": None, "code": 404}}, status=404)
        if mode == "hang":
            await asyncio.sleep(3600)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "garbage":
            await resp.write(b"data: this is not json\n\n")
            return resp
        self.num_in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.num_in_flight)
        try:
            await self._stream(request, resp, body, mode)
        finally:
            self.num_in_flight -= 1
        return resp

    async def _stream(self, request: web.Request, resp: web.StreamResponse, body: dict[str, Any],
                      mode: str) -> None:
        n = int(body.get("max_tokens", 16))
        cut = int(mode.split(":")[1]) if ":" in mode else None
        for i in range(n):
            if cut is not None and i == cut:
                if mode.startswith("hang_after"):
                    await asyncio.sleep(3600)
                assert request.transport is not None
                request.transport.abort()  # drop the connection: no terminating chunk
                return
            await asyncio.sleep(self.delay_s)
            last = i == n - 1
            chunk = {"choices": [{"index": 0, "text": f" {WORDS[i % len(WORDS)]}",
                                  "finish_reason": "length" if last else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/metrics", self._metrics)
            app.router.add_post("/v1/completions", self._completions)
            self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
            self._loop.run_until_complete(site.start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name=f"fake-engine-{self.port}")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection (the engine 'dies')."""
        if self._loop is None or self._runner is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        fut.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = self._runner = None
