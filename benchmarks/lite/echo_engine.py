"""An OpenAI-compatible server that does no work: every completion streams ``max_tokens``
one-word chunks at once. In front of three of these, a router's added latency is not
lost in an engine's own jitter.

    python -m benchmarks.lite.echo_engine --port 9001
"""
from __future__ import annotations

import argparse
import json

from aiohttp import web


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "smollm2", "object": "model"}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = int(body.get("max_tokens", 1))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        chunk = {"id": "cmpl-echo", "object": "text_completion", "model": "smollm2",
                 "choices": [{"index": 0, "text": " word", "finish_reason": "length" if i == n - 1 else None}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    await resp.write_eof()
    return resp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
