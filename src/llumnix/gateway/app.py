"""The FastAPI app: OpenAI completions and chat completions, streaming or not."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from llumnix.core.errors import InvalidRequestError, LlumnixError
from llumnix.gateway.backend import Backend, GenerateRequest
from llumnix.gateway.detokenizer import IncrementalDetokenizer
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    new_id,
    now_s,
    parse_priority,
)

PRIORITY_HEADER = "x-llumnix-priority"
_KEYED = ("/tokenize", "/detokenize")
"""Paths outside /v1/ that still need the API key when one is set."""
log = logging.getLogger(__name__)

TokenLogprob = tuple[int, float, list[tuple[int, float]] | None]
"""A generated token, its logprob, and its most likely alternatives when asked for."""
EchoLogprob = tuple[int, float | None, list[tuple[int, float]] | None]
"""A token of a completions answer's logprobs: an echoed prompt's first token has none."""
RunItem = tuple[str, str | None, int, list[TokenLogprob], list[TokenLogprob] | None, int]
"""One step of a choice: new text, finish reason, output tokens so far, logprobs of the new
tokens, (on the first step, when asked for) the prompt's tokens after the first with theirs,
and the prompt tokens the prefix cache served."""


def error_response(status: int, message: str, *, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


class _Auth:
    """Bearer-key check as a plain ASGI middleware: Starlette's ``BaseHTTPMiddleware``
    (``@app.middleware``) re-wraps every request and stream and costs about a millisecond
    per request, which is most of the 5 ms the gateway may add."""

    def __init__(self, app: Any, api_key: str | None, admin_requires_key: bool) -> None:
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.admin_requires_key = admin_requires_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            admin = path.startswith("/admin/")
            rejection = None
            if admin and self.admin_requires_key and self.expected is None:
                rejection = error_response(403, "admin endpoints need --api-key when not on loopback",
                                           type_="permission_error")
            elif (self.expected is not None and (admin or path.startswith("/v1/") or path in _KEYED)
                  and dict(scope["headers"]).get(b"authorization", b"") != self.expected):
                rejection = error_response(401, "missing or wrong API key", type_="authentication_error")
            if rejection is not None:
                await rejection(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(backend: Backend, *, api_key: str | None = None, admin_requires_key: bool = False,
              default_max_tokens: int = 256) -> FastAPI:
    app = FastAPI(title="Llumnix", version="0.1.0")
    metrics = GatewayMetrics(backend.model_name)
    m = metrics.labels

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        metrics.rejected.labels(model_name=backend.model_name, status="400").inc()
        if err.get("type") == "json_invalid":  # loc is ("body", <offset>): no parameter to name
            ctx = err.get("ctx")
            reason = ctx.get("error") if isinstance(ctx, dict) else None
            return error_response(400, "request body is not valid JSON" + (f" ({reason})" if reason else ""))
        ctx = err.get("ctx")
        raised = ctx.get("error") if isinstance(ctx, dict) else None
        if isinstance(raised, InvalidRequestError) and raised.param:  # a whole-body check naming its field
            return error_response(400, str(raised), param=raised.param)
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if not loc and err.get("type") in ("model_attributes_type", "dict_type", "missing"):
            kind = request.headers.get("content-type", "")
            hint = "" if "json" in kind else f" sent as application/json (this one came as {kind or 'no type'!r})"
            return error_response(400, "the request body must be a JSON object" + hint)
        msg = str(err.get("msg", "invalid request")).removeprefix("Value error, ")  # our validators' own words
        return error_response(400, f"{'.'.join(loc)}: {msg}" if loc else msg,
                              param=loc[0] if loc else None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths and methods get OpenAI's error shape too, not FastAPI's {"detail": ...}.
        if exc.status_code == 404:
            message = f"no route {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, type_="NotFoundError" if exc.status_code == 404
                              else "invalid_request_error")

    @app.exception_handler(InvalidRequestError)
    async def _bad(_: Request, exc: InvalidRequestError) -> JSONResponse:
        metrics.rejected.labels(model_name=backend.model_name, status="400").inc()
        return error_response(400, str(exc), param=exc.param)

    @app.exception_handler(LlumnixError)
    async def _unavailable(_: Request, exc: LlumnixError) -> JSONResponse:
        return error_response(503, str(exc), type_="server_error")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        # A dead or restarting actor behind an admin call: one clear line, no traceback.
        log.warning("request failed: %s: %s", type(exc).__name__, exc)
        return error_response(503 if isinstance(exc, TimeoutError) else 500,
                              f"{type(exc).__name__}: {exc}", type_="server_error")

    app.add_middleware(_Auth, api_key=api_key, admin_requires_key=admin_requires_key)

    def _check_model(name: str) -> JSONResponse | None:
        if name != backend.model_name:
            metrics.rejected.labels(model_name=backend.model_name, status="404").inc()
            return error_response(404, f"the model '{name}' does not exist; this server serves "
                                  f"'{backend.model_name}'", type_="NotFoundError",
                                  param="model", code="model_not_found")
        return None

    def _prepare(body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
                 request: Request, id_prefix: str = "cmpl") -> tuple[str, list[GenerateRequest]]:
        """The response's id and one engine request per choice (``n`` of them: each is
        served, and may migrate, on its own; with a seed, choice i samples with seed + i)."""
        if any(not 0 <= t < backend.vocab_size for t in prompt_ids):
            raise InvalidRequestError("prompt token ids must be in [0, vocab size)", "prompt")
        params = body.sampling_params(default_max_tokens)
        if any(t >= backend.vocab_size for t, _ in params.logit_bias):
            raise InvalidRequestError("logit_bias keys must be token ids in [0, vocab size)", "logit_bias")
        if any(not 0 <= t < backend.vocab_size for t in params.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be token ids in [0, vocab size)", "stop_token_ids")
        room = backend.max_model_len - len(prompt_ids)  # < 1: validate names the prompt
        if room >= 1 and params.max_tokens > room:
            if body.max_tokens is not None:  # asked for explicitly: refused, as OpenAI and vLLM do
                raise InvalidRequestError(
                    f"this model's context is {backend.max_model_len} tokens and the prompt has "
                    f"{len(prompt_ids)}, so max_tokens can be at most {room}, not {params.max_tokens}",
                    "max_tokens")
            params = dataclasses.replace(params, max_tokens=room)  # the default fits what is left
        backend.validate(len(prompt_ids), params)
        header = request.headers.get(PRIORITY_HEADER)
        priority = parse_priority(header if header is not None else body.priority)
        response_id, now = new_id(id_prefix), time.monotonic()
        if body.n == 1:
            return response_id, [GenerateRequest(response_id, prompt_ids, params, priority, now)]
        return response_id, [
            GenerateRequest(f"{response_id}-{i}", prompt_ids,
                            params if params.seed is None else dataclasses.replace(params, seed=params.seed + i),
                            priority, now)
            for i in range(body.n)]

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any] | JSONResponse:
        state = await backend.health()
        # Probes and load balancers read the status code: 503 while no instance can serve.
        return state if state.get("status") == "ok" else JSONResponse(state, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        try:
            metrics.observe_cluster(await backend.cluster_info())
        except Exception as e:  # noqa: BLE001 - the gateway's own metrics are still worth serving
            log.warning("cluster metrics unavailable: %s", e)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": backend.model_name, "object": "model",
                                            "created": now_s(), "owned_by": "llumnix",
                                            "max_model_len": backend.max_model_len}]}

    @app.get("/admin/cluster")
    async def cluster() -> dict[str, Any]:
        return await backend.cluster_info()

    @app.post("/admin/instances/{instance_id}/drain")
    async def drain(instance_id: str) -> dict[str, Any]:
        return await backend.drain_instance(instance_id)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if (bad := _check_model(body.model)) is not None:
            return bad
        prompt = body.prompt
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        ids = backend.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        response_id, gens = _prepare(body, ids, request)
        echo = "" if not body.echo else prompt if isinstance(prompt, str) else backend.tokenizer.decode(ids)
        return await _respond(request, response_id, gens, body, chat=False, prefix=echo)

    def _chat_prompt_ids(messages: list[ChatMessage]) -> list[int]:
        """The token ids a chat prefills: the messages through the model's chat template."""
        text = backend.tokenizer.apply_chat_template([msg.model_dump() for msg in messages])
        return backend.tokenizer.encode(text, add_special_tokens=False)

    @app.post("/tokenize", response_model=None)
    async def tokenize(body: TokenizeRequest) -> Response:
        """vLLM's: the token ids the server would prefill for this prompt or chat."""
        if (bad := _check_model(body.model)) is not None:
            return bad
        if body.messages is not None:
            ids = _chat_prompt_ids(body.messages)
        else:
            ids = backend.tokenizer.encode(body.prompt or "", add_special_tokens=body.add_special_tokens)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": backend.max_model_len})

    @app.post("/detokenize", response_model=None)
    async def detokenize(body: DetokenizeRequest) -> Response:
        if (bad := _check_model(body.model)) is not None:
            return bad
        if any(not 0 <= t < backend.vocab_size for t in body.tokens):
            raise InvalidRequestError("token ids must be in [0, vocab size)", "tokens")
        return JSONResponse({"prompt": backend.tokenizer.decode(body.tokens)})

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        if (bad := _check_model(body.model)) is not None:
            return bad
        response_id, gens = _prepare(body, _chat_prompt_ids(body.messages), request, "chatcmpl")
        return await _respond(request, response_id, gens, body, chat=True)

    async def _respond(request: Request, response_id: str, gens: list[GenerateRequest],
                       body: CompletionRequest | ChatCompletionRequest, *, chat: bool, prefix: str = "") -> Response:
        as_ids = body.return_tokens_as_token_ids
        echo_only = isinstance(body, CompletionRequest) and body.echo_only
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_sse(response_id, gens, chat=chat, prefix=prefix, usage=usage, as_ids=as_ids,
                                          echo_only=echo_only),
                                     media_type="text/event-stream")
        # Not streamed: nothing is sent until the end, so a client that gives up (a
        # timeout) is noticed only by watching for its disconnect; then its requests stop.
        work = asyncio.ensure_future(_complete(response_id, gens, chat=chat, prefix=prefix, as_ids=as_ids,
                                               echo_only=echo_only))
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the handler itself stopped (shutdown): so does the work
            work.cancel()
            watch.cancel()
            raise
        watch.cancel()
        if not work.done():
            work.cancel()  # each choice's _run aborts its request and frees its KV
            await asyncio.gather(work, return_exceptions=True)
            return Response(status_code=499)  # nobody reads it (nginx's "client closed request")
        return work.result()

    async def _disconnected(request: Request) -> None:
        """Returns when the client goes away. The body has been read, so the next ASGI
        message is the disconnect: waiting for it costs nothing (no polling)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def _run(gen: GenerateRequest) -> AsyncIterator[RunItem]:
        """Yield (new text, finish reason, output tokens, (token, logprob) of the new tokens
        when logprobs were asked for, prompt logprobs, cached prompt tokens) and keep the
        metrics."""
        det = IncrementalDetokenizer(backend.tokenizer, gen.params.stop, gen.params.min_tokens)
        metrics.in_flight.labels(model_name=backend.model_name).inc()
        first = last = None
        finished = False
        n_out = n_cached = 0
        want_lp = gen.params.logprobs is not None
        try:
            async for out in backend.generate(gen):
                now = time.monotonic()
                if first is None:
                    first = now
                    m(metrics.ttft).observe(now - gen.arrival_time)
                last = now
                n_out = out.num_output_tokens
                if out.metrics is not None:
                    n_cached = out.metrics.num_cached_tokens
                text = det.add(out.new_token_ids, final=out.is_finished)
                lps: list[TokenLogprob] = []
                if want_lp:
                    tops = out.new_top_logprobs
                    lps = [(t, lp, tops[j] if tops else None)
                           for j, (t, lp) in enumerate(zip(out.new_token_ids, out.new_logprobs or (), strict=False))]
                plps = out.prompt_logprobs
                reason = out.finish_reason
                if det.stopped and reason is None:
                    reason = "stop"  # the stop string completed before the engine saw it
                if reason is not None:
                    finished = True
                    yield text, reason, n_out, lps, plps, n_cached
                    metrics.requests.labels(model_name=backend.model_name,
                                            finished_reason=reason).inc()
                    break
                if text or lps or plps is not None:
                    yield text, None, n_out, lps, plps, n_cached
        finally:
            metrics.in_flight.labels(model_name=backend.model_name).dec()
            if not finished:
                m(metrics.aborted).inc()
                await backend.abort(gen.request_id)  # client gone or error: free the KV
            else:
                m(metrics.prompt_tokens).inc(len(gen.prompt_token_ids))
                m(metrics.prompt_tokens_cached).inc(n_cached)
                m(metrics.generation_tokens).inc(n_out)
                if first is not None and last is not None:
                    m(metrics.e2e).observe(last - gen.arrival_time)
                    if n_out > 1:
                        m(metrics.tpot).observe((last - first) / (n_out - 1))

    def want_logprobs(gen: GenerateRequest) -> bool:
        return gen.params.logprobs is not None

    def _token_text(token_id: int) -> str:
        return backend.tokenizer.decode([token_id], skip_special_tokens=False)

    def _label(token_id: int, as_ids: bool) -> str:
        """How a logprobs answer names a token: its text, or (vLLM's
        ``return_tokens_as_token_ids``) "token_id:N", which survives tokens whose text
        is not valid UTF-8 alone and lets a client map answers back to ids."""
        return f"token_id:{token_id}" if as_ids else _token_text(token_id)

    def _completion_logprobs(lps: Sequence[EchoLogprob], offset: int,
                             as_ids: bool = False) -> tuple[dict[str, Any], int]:
        """The legacy completions shape: per token its text, logprob and offset, and with
        ``logprobs`` = N > 0 the N most likely tokens by text, plus the chosen one (as
        OpenAI does: up to N + 1 entries). An echoed prompt's first token has no logprob
        (None), as in OpenAI's answers. Offsets count the tokens' text in any case; the
        second value is the offset after the last token."""
        texts = [_token_text(t) for t, _, _ in lps]
        offsets, pos = [], offset
        for text in texts:
            offsets.append(pos)
            pos += len(text)
        tokens = [f"token_id:{t}" for t, _, _ in lps] if as_ids else texts
        tops = None
        if any(top is not None for _, _, top in lps):
            tops = [None if lp is None else {**{_label(a, as_ids): alp for a, alp in (top or ())}, tok: lp}
                    for tok, (_, lp, top) in zip(tokens, lps, strict=True)]
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in lps], "top_logprobs": tops,
                "text_offset": offsets}, pos

    def _echo_entries(gen: GenerateRequest, prompt_lps: list[TokenLogprob] | None) -> list[EchoLogprob]:
        """An echoed prompt's logprobs entries: its first token (no logprob), then the rest."""
        return [(gen.prompt_token_ids[0], None, None), *(prompt_lps or ())]

    def _chat_logprobs(lps: list[TokenLogprob], as_ids: bool = False) -> dict[str, Any]:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            tok = _token_text(token_id)
            return {"token": _label(token_id, as_ids), "logprob": lp, "bytes": list(tok.encode())}

        return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in (top or ())]}
                            for t, lp, top in lps]}

    def _usage(gens: list[GenerateRequest], n_out: int, n_cached: int) -> dict[str, Any]:
        """OpenAI's usage block. The prompt counts once, as OpenAI counts it, and so do its
        cached tokens: those of the first choice (the prompt tokens whose KV the prefix
        cache supplied, so they were not computed)."""
        n_in = len(gens[0].prompt_token_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out,
                "prompt_tokens_details": {"cached_tokens": n_cached}}

    async def _choices(gens: list[GenerateRequest]) -> AsyncIterator[tuple[int, RunItem]]:
        """Every choice's ``_run`` items as they come, tagged with the choice's index. If one
        choice fails, or the consumer stops (the client left), the others are stopped too:
        each one's ``_run`` then aborts its request and frees its KV."""
        if len(gens) == 1:  # no task or queue in the common case
            async for item in _run(gens[0]):
                yield 0, item
            return
        queue: asyncio.Queue[tuple[int, RunItem | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, gen: GenerateRequest) -> None:
            try:
                async for item in _run(gen):
                    queue.put_nowait((i, item))
                queue.put_nowait((i, None))
            except Exception as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                queue.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
        try:
            left = len(tasks)
            while left:
                i, got = await queue.get()
                if got is None:
                    left -= 1
                elif isinstance(got, BaseException):
                    raise got
                else:
                    yield i, got
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _complete(response_id: str, gens: list[GenerateRequest], *, chat: bool, prefix: str,
                        echo_only: bool = False, as_ids: bool = False) -> Response:
        """``echo_only``: OpenAI's scoring form (echo, max_tokens 0): the answer is the prompt
        and its logprobs; the one token the engine generated to get there is left out."""
        pieces: list[list[str]] = [[prefix] for _ in gens]
        reasons: list[str | None] = ["length" if echo_only else None] * len(gens)
        n_outs = [0] * len(gens)
        lps: list[list[TokenLogprob]] = [[] for _ in gens]
        prompt_lps: list[list[TokenLogprob] | None] = [None] * len(gens)
        n_cached = 0
        try:
            async for i, (text, last_reason, last_n, new_lps, plps, cached) in _choices(gens):
                if i == 0:
                    n_cached = cached
                if plps is not None:
                    prompt_lps[i] = plps
                if echo_only:
                    continue
                pieces[i].append(text)
                lps[i] += new_lps
                reasons[i], n_outs[i] = last_reason, last_n
        except InvalidRequestError as e:
            return error_response(400, str(e))
        except LlumnixError as e:
            return error_response(503, f"the request failed: {e}", type_="server_error")
        want_lp = want_logprobs(gens[0])
        choices: list[dict[str, Any]] = []
        for i in range(len(gens)):
            text = "".join(pieces[i])
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text},
                                "logprobs": _chat_logprobs(lps[i], as_ids) if want_lp else None,
                                "finish_reason": reasons[i]})
            else:
                entries: list[EchoLogprob] = list(lps[i])
                offset = len(prefix)
                if prompt_lps[i] is not None:  # echo: the prompt's tokens lead, from offset 0
                    entries = [*_echo_entries(gens[i], prompt_lps[i]), *entries]
                    offset = 0
                choices.append({"index": i, "text": text, "finish_reason": reasons[i],
                                "logprobs": _completion_logprobs(entries, offset, as_ids)[0] if want_lp else None})
        return JSONResponse({"id": response_id, "object": "chat.completion" if chat else "text_completion",
                             "created": now_s(), "model": backend.model_name, "choices": choices,
                             "usage": _usage(gens, sum(n_outs), n_cached)})

    async def _sse(response_id: str, gens: list[GenerateRequest], *, chat: bool, prefix: str,
                   usage: bool, as_ids: bool = False, echo_only: bool = False) -> AsyncIterator[str]:
        """``echo_only``: as in ``_complete``. An echo with logprobs sends its prompt chunk
        once the prompt's logprobs arrive (with the first output), carrying them."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = now_s()
        scoring = gens[0].params.prompt_logprobs is not None  # set by an echo with logprobs only
        pos = [0 if scoring else len(prefix)] * len(gens)  # each choice's text_offset of its next token

        def chunk(i: int, text: str, reason: str | None, first: bool = False,
                  lps: list[TokenLogprob] | None = None, echo_lps: list[EchoLogprob] | None = None) -> str:
            if chat:
                delta: dict[str, str] = {"role": "assistant"} if first else {}
                if text:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": reason,
                                          "logprobs": _chat_logprobs(lps, as_ids) if lps else None}
            else:
                entries: Sequence[EchoLogprob] = echo_lps or lps or ()
                lp = None
                if entries:
                    lp, pos[i] = _completion_logprobs(entries, pos[i], as_ids)
                choice = {"index": i, "text": text, "finish_reason": reason, "logprobs": lp}
            return "data: " + json.dumps({"id": response_id, "object": obj, "created": created,
                                          "model": backend.model_name, "choices": [choice]}) + "\n\n"

        if (chat or prefix) and not scoring:
            for i in range(len(gens)):
                yield chunk(i, prefix, None, first=True)
        n_outs = [0] * len(gens)
        n_cached = 0
        opened = [not scoring] * len(gens)
        try:
            async for i, (text, reason, last_n, lps, plps, cached) in _choices(gens):
                if i == 0:
                    n_cached = cached
                if not opened[i]:
                    opened[i] = True
                    yield chunk(i, prefix, None, echo_lps=_echo_entries(gens[i], plps))
                if echo_only:
                    if reason is not None:
                        yield chunk(i, "", "length")
                    continue
                n_outs[i] = last_n
                yield chunk(i, text, reason, lps=lps)
        except LlumnixError as e:
            err = {"error": {"message": f"the request failed: {e}", "type": "server_error"}}
            yield "data: " + json.dumps(err) + "\n\n"
        if usage:
            last = {"id": response_id, "object": obj, "created": created,
                    "model": backend.model_name, "choices": [], "usage": _usage(gens, sum(n_outs), n_cached)}
            yield "data: " + json.dumps(last) + "\n\n"
        yield "data: [DONE]\n\n"

    return app
