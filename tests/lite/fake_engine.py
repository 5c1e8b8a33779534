"""A small OpenAI-compatible engine for lite-mode tests: a real HTTP server (aiohttp, in
a thread of its own) whose answers a test chooses: stream words, refuse with a 500,
hang, stream garbage, or break off mid-stream; or misbehave in ways only a distrustful
gateway notices (token ids outside the vocabulary, huge lines, bodies and headers,
impossible usage, output past ``max_tokens``, a stream that never ends)."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import threading
from typing import Any

from aiohttp import web

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def expected_text(n: int) -> str:
    """What the engine streams for ``max_tokens=n`` (one word a chunk)."""
    return "".join(f" {WORDS[i % len(WORDS)]}" for i in range(n))


BAD_ID = 10**6
"""A token id outside every test vocabulary."""


@functools.cache
def _ids(text: str) -> list[int]:
    """The text's ids in the tests' gateway tokenizer (``chatml_tokenizer``)."""
    from tests.gateway.fake_backend import chatml_tokenizer

    return chatml_tokenizer().encode(text, add_special_tokens=False)


class FakeEngine:
    """``mode``: ok | error500 | hang | garbage | break_after:K (K chunks, then the
    connection drops) | hang_after:K | ids (each chunk carries its token ids too) | ids:K
    (two tokens a chunk, and K chunks past max_tokens) |
    bad_id_after:K (K chunks with ids in the vocabulary, then ``BAD_ID``) | long_line:N (a
    data line of N bytes, no newline) | big_error:N (a 500 whose body is N bytes) |
    big_headers:N (a header of N bytes) | usage:JSON (that as usage's completion_tokens) |
    cached:JSON (that as its cached_tokens) | overrun:K (K chunks past max_tokens) |
    big_text:K,N (chunk K carries N characters of text, far more than one token's) |
    endless (empty chunks until the gateway hangs up). ``delay_s`` between chunks.
    ``metrics``: a vLLM page or None (404)."""

    def __init__(self, mode: str = "ok", delay_s: float = 0.0, model: str = "fake-model",
                 metrics: str | None = None, models: tuple[str, ...] = (), models_bytes: int = 0) -> None:
        self.mode, self.delay_s, self.model, self.metrics = mode, delay_s, model, metrics
        self.models_bytes = models_bytes
        """Pad /v1/models to this many bytes (0: no padding)."""
        self.models = (model, *models)
        """What /v1/models lists; a completion naming another model gets vLLM's 404."""
        self.prompts: list[Any] = []
        self.bodies: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        """Each completion request's Authorization header (None: none sent)."""
        self.num_in_flight = 0
        self.num_huge_bytes_sent = 0
        """Bytes of a huge body, line or header written before the gateway hung up."""
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
        page = {"object": "list", "data": [{"id": m, "max_model_len": 4096} for m in self.models]}
        if self.models_bytes:
            page["padding"] = "x" * self.models_bytes
        return web.json_response(page)

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
        name, _, arg = mode.partition(":")
        if mode == "error500":
            return web.json_response({"error": {"message": "engine on fire"}}, status=500)
        if name in ("big_error", "long_line", "big_headers"):
            return await self._huge(request, name, int(arg))
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
        except ConnectionError:
            pass  # the gateway hung up (as it does on an engine that runs past max_tokens)
        finally:
            self.num_in_flight -= 1
        return resp

    async def _stream(self, request: web.Request, resp: web.StreamResponse, body: dict[str, Any],
                      mode: str) -> None:
        name, _, arg = mode.partition(":")
        n = int(body.get("max_tokens", 16)) + (int(arg) if name == "overrun" else 0)
        if name == "ids" and arg:
            n = (n + 1) // 2 + int(arg)
        cut = int(arg) if name in ("break_after", "hang_after") else None
        if name == "endless":  # no token, no end: only the gateway's budget stops it
            with contextlib.suppress(ConnectionError):
                while request.transport is not None and not request.transport.is_closing():
                    await resp.write(b'data: {"choices": [{"index": 0, "text": ""}]}\n\n: keep-alive\n\n' * 64)
                    self.num_huge_bytes_sent += 64 * 61
                    await asyncio.sleep(0)
            return
        for i in range(n):
            if cut is not None and i == cut:
                if mode.startswith("hang_after"):
                    await asyncio.sleep(3600)
                assert request.transport is not None
                request.transport.abort()  # drop the connection: no terminating chunk
                return
            await asyncio.sleep(self.delay_s)
            last = i == n - 1
            choice: dict[str, Any] = {"index": 0, "text": f" {WORDS[i % len(WORDS)]}",
                                      "finish_reason": "length" if last else None}
            if name == "big_text" and i == int(arg.split(",")[0]):  # one chunk of many tokens' text
                choice["text"] = "many words " * (int(arg.split(",")[1]) // 11)
            if name in ("ids", "bad_id_after"):  # one token a chunk: a letter, and its id
                choice["text"] = LETTERS[i % len(LETTERS)] if name != "ids" or not arg else LETTERS[2 * i:2 * i + 2]
                choice["token_ids"] = [BAD_ID] if name == "bad_id_after" and i >= int(arg) else \
                    _ids(choice["text"])
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        usage: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        if name == "usage":
            usage["completion_tokens"] = json.loads(arg)
        if name == "cached":
            usage["prompt_tokens_details"] = {"cached_tokens": json.loads(arg)}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")

    async def _huge(self, request: web.Request, name: str, size: int) -> web.StreamResponse:
        """``size`` bytes where a sane engine sends a few: an error body, one SSE line or a
        header; written 64 KiB at a time, so a gateway that hangs up early stops it."""
        headers = {"Content-Type": "text/event-stream"}
        if name == "big_headers":
            headers["X-Padding"] = "a" * size
        resp = web.StreamResponse(status=500 if name == "big_error" else 200, headers=headers)
        await resp.prepare(request)
        if name == "big_headers":
            return resp
        piece = b"x" * (1 << 16)
        await resp.write(b'data: {"choices": [{"index": 0, "text": "' if name == "long_line" else b"{")
        with contextlib.suppress(ConnectionError):
            for _ in range(size >> 16):
                await resp.write(piece)
                self.num_huge_bytes_sent += len(piece)
        return resp

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
