"""Answering a prepared response: streamed (SSE), or whole once every choice finished,
stopping the work when the client goes away."""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from llumnix.gateway.choices import Reply, merge_choices
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.disconnect import ClientWatch
from llumnix.gateway.errors import failure_body, retry_headers
from llumnix.gateway.formatting import (
    EchoLogprob,
    TokenLogprob,
    echo_entries,
    json_bytes,
    response_body,
    usage,
)
from llumnix.gateway.protocol import now_s
from llumnix.gateway.streaming import EventStream, sse_events


async def respond(ctx: GatewayContext, request: Request, reply: Reply) -> Response:
    if reply.stream:
        return EventStream(sse_events(ctx, reply))
    # Not streamed: nothing is sent until the end, so a client that gives up (a
    # timeout) is noticed only by watching for its disconnect; then its requests stop
    # (each choice's run_choice aborts its request and frees its KV).
    with ClientWatch(request.receive) as client:
        response = await complete(ctx, reply)
    if client.left:
        return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
    return response


async def complete(ctx: GatewayContext, reply: Reply) -> Response:
    """The whole answer: every choice's text, finish reason and logprobs, and the usage."""
    n = len(reply.gens)
    pieces: list[list[str]] = [[reply.prefix] for _ in range(n)]
    reasons: list[str | None] = ["length" if reply.echo_only else None] * n
    n_outs = [0] * n
    lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
    prompt_lps: list[list[TokenLogprob] | None] = [None] * n
    n_cached = 0
    try:
        async for i, step in merge_choices(ctx, reply.gens):
            if i == 0:
                n_cached = step.num_cached_tokens
            if step.prompt_logprobs is not None:
                prompt_lps[i] = step.prompt_logprobs
            if reply.echo_only:
                continue
            pieces[i].append(step.text)
            lps[i] += step.logprobs
            reasons[i], n_outs[i] = step.finish_reason, step.num_output_tokens
    except Exception as e:  # noqa: BLE001 - answered as the error handlers would, the detail logged
        status, error = failure_body(e, "the request failed: ")
        return JSONResponse(error, status_code=status, headers=retry_headers(e))
    choices = [_choice(ctx, reply, i, "".join(pieces[i]), reasons[i], lps[i], prompt_lps[i]) for i in range(n)]
    body = response_body(reply.response_id, reply.model or ctx.model_name, now_s(), choices, chat=reply.chat)
    body["usage"] = usage(len(reply.gens[0].prompt_token_ids), sum(n_outs), n_cached)
    return Response(json_bytes(body), media_type="application/json")


def _choice(ctx: GatewayContext, reply: Reply, i: int, text: str, reason: str | None,
            lps: list[TokenLogprob], prompt_lps: list[TokenLogprob] | None) -> dict[str, Any]:
    fmt = ctx.logprob_format(reply.as_ids)
    want_lp = reply.wants_logprobs
    if reply.chat:
        return {"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": fmt.chat(lps) if want_lp else None, "finish_reason": reason}
    entries: list[EchoLogprob] = list(lps)
    offset = len(reply.prefix)
    if prompt_lps is not None:  # echo: the prompt's tokens lead, from offset 0
        entries = [*echo_entries(reply.gens[i].prompt_token_ids, prompt_lps), *entries]
        offset = 0
    return {"index": i, "text": text, "finish_reason": reason,
            "logprobs": fmt.completion(entries, offset)[0] if want_lp else None}
