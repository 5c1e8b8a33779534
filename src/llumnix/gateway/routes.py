"""The OpenAI routes (completions, chat, models), vLLM's /tokenize and /detokenize, and
the probes (/health, /live, /ping, /metrics) and /version."""
from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request

import llumnix
from llumnix.core.errors import InvalidRequestError
from llumnix.gateway.backend import model_names
from llumnix.gateway.context import context
from llumnix.gateway.prepare import check_model, prepare
from llumnix.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    now_s,
)
from llumnix.gateway.respond import respond
from llumnix.gateway.tokens import decode, encode_chat, encode_prompt

log = logging.getLogger(__name__)
router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> dict[str, Any] | JSONResponse:
    state = await context(request).backend.health()
    # Probes and load balancers read the status code: 503 while no instance can serve.
    return state if state.get("status") == "ok" else JSONResponse(state, status_code=503)


@router.get("/live")
async def live() -> dict[str, str]:
    """Liveness: the gateway process answers (``/health`` says whether the cluster can serve)."""
    return {"status": "alive"}


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    ctx = context(request)
    try:
        ctx.metrics.observe_cluster(await ctx.backend.cluster_info())
    except Exception as e:  # noqa: BLE001 - the gateway's own metrics are still worth serving
        log.warning("cluster metrics unavailable: %s", e)
        ctx.metrics.observe_cluster(None)  # no cluster series rather than stale ones
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """vLLM's shape: the served name as ``id``, the model it stands for as ``root``; a
    backend that serves more names (lite and mixed pools) lists each, as its own root."""
    ctx = context(request)
    created = now_s()

    def entry(name: str) -> dict[str, Any]:
        permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        root = (ctx.config.model_root or name) if name == ctx.model_name else name
        return {"id": name, "object": "model", "created": created, "owned_by": "llumnix", "root": root,
                "parent": None, "max_model_len": ctx.backend.max_model_len, "permission": [permission]}

    return {"object": "list", "data": [entry(name) for name in model_names(ctx.backend)]}


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": llumnix.__version__}


@router.api_route("/ping", methods=["GET", "POST"])
async def ping(request: Request) -> Response:
    """vLLM's (and SageMaker's) probe: 200 while some instance can serve, else 503."""
    state = await context(request).backend.health()
    return Response(status_code=503 if state.get("status") == "unavailable" else 200)


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    ctx = context(request)
    if (bad := check_model(ctx, body.model)) is not None:
        return bad
    prompt = body.prompt
    if not prompt:
        raise InvalidRequestError("prompt must not be empty", "prompt")
    ids = await encode_prompt(ctx, prompt) if isinstance(prompt, str) else list(prompt)
    reply = prepare(ctx, body, ids, request)
    if body.echo:
        reply = dataclasses.replace(reply, prefix=prompt if isinstance(prompt, str) else await decode(ctx, ids))
    return await respond(ctx, request, reply)


@router.post("/v1/chat/completions", response_model=None)
async def chat(body: ChatCompletionRequest, request: Request) -> Response:
    ctx = context(request)
    if (bad := check_model(ctx, body.model)) is not None:
        return bad
    return await respond(ctx, request, prepare(ctx, body, await encode_chat(ctx, body.messages), request))


@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """vLLM's: the token ids the server would prefill for this prompt or chat."""
    ctx = context(request)
    if (bad := check_model(ctx, body.model)) is not None:
        return bad
    if body.messages is not None:
        ids = await encode_chat(ctx, body.messages, bounded=False)
    else:
        ids = await encode_prompt(ctx, body.prompt or "", body.add_special_tokens, bounded=False)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": ctx.backend.max_model_len})


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    ctx = context(request)
    if (bad := check_model(ctx, body.model)) is not None:
        return bad
    if any(not 0 <= t < ctx.backend.vocab_size for t in body.tokens):
        raise InvalidRequestError("token ids must be in [0, vocab size)", "tokens")
    return JSONResponse({"prompt": await decode(ctx, body.tokens)})
