"""A streamed response as server-sent events: one chunk per choice step, an optional
usage chunk, then ``[DONE]``."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.responses import JSONResponse, Response

from llumnix.gateway.choices import Reply, merge_choices
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.disconnect import ClientWatch
from llumnix.gateway.errors import failure_body, retry_headers
from llumnix.gateway.formatting import EchoLogprob, TokenLogprob, echo_entries, response_body, sse, usage
from llumnix.gateway.protocol import now_s


class _Chunks:
    """The chunks of one streamed response; keeps each choice's ``text_offset`` of its next token."""

    def __init__(self, ctx: GatewayContext, reply: Reply) -> None:
        self.reply = reply
        self.model = reply.model or ctx.model_name
        self.fmt = ctx.logprob_format(reply.as_ids)
        self.created = now_s()
        self.scoring = reply.gens[0].params.prompt_logprobs is not None  # set by an echo with logprobs only
        self.pos = [0 if self.scoring else len(reply.prefix)] * len(reply.gens)

    def choice(self, i: int, text: str, reason: str | None, *, first: bool = False,
               lps: list[TokenLogprob] | None = None, echo_lps: list[EchoLogprob] | None = None) -> bytes:
        choice: dict[str, Any]
        if self.reply.chat:
            delta: dict[str, str] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": i, "delta": delta, "finish_reason": reason,
                      "logprobs": self.fmt.chat(lps) if lps else None}
        else:
            entries: Sequence[EchoLogprob] = echo_lps or lps or ()
            lp = None
            if entries:
                lp, self.pos[i] = self.fmt.completion(entries, self.pos[i])
            choice = {"index": i, "text": text, "finish_reason": reason, "logprobs": lp}
        return sse(self._body([choice]))

    def usage(self, num_output_tokens: int, num_cached_tokens: int) -> bytes:
        body = self._body([])
        body["usage"] = usage(len(self.reply.gens[0].prompt_token_ids), num_output_tokens, num_cached_tokens)
        return sse(body)

    def _body(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return response_body(self.reply.response_id, self.model, self.created, choices,
                             chat=self.reply.chat, chunk=True)


class StreamRefused(Exception):  # noqa: N818 - not an error of its own: it carries one
    """The request failed before its stream's first event (dispatch refused it: a shed
    request): ``EventStream`` answers it with its HTTP status instead of a 200 stream."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def sse_events(ctx: GatewayContext, reply: Reply) -> AsyncIterator[bytes]:
    """A chat choice opens with its role, an echo with its prompt; an echo with logprobs
    sends its prompt chunk once the prompt's logprobs arrive (with the first output),
    carrying them. Nothing is yielded (so no header sent) before the first choice has run
    up to its dispatch: a request refused there raises ``StreamRefused``."""
    chunks, gens = _Chunks(ctx, reply), reply.gens
    steps = merge_choices(ctx, gens)
    first = asyncio.ensure_future(_next(steps))
    await asyncio.sleep(0)  # one choice dispatches before its first wait (n > 1: in tasks, later)
    if first.done() and first.exception() is not None:
        raise StreamRefused(first.exception())  # type: ignore[arg-type]
    try:
        yield b""  # the headers may go
        if (reply.chat or reply.prefix) and not chunks.scoring:
            for i in range(len(gens)):
                yield chunks.choice(i, reply.prefix, None, first=True)
    except GeneratorExit:  # the client left at once
        first.cancel()
        raise
    n_outs = [0] * len(gens)
    n_cached = 0
    opened = [not chunks.scoring] * len(gens)
    n_open = len(gens)
    last = b""  # the last choice's finishing chunk, held to go out with the stream's tail
    try:
        async for i, step in _then(first, steps):
            if i == 0:
                n_cached = step.num_cached_tokens
            if not opened[i]:
                opened[i] = True
                yield chunks.choice(i, reply.prefix, None,
                                    echo_lps=echo_entries(gens[i].prompt_token_ids, step.prompt_logprobs))
            if reply.echo_only:
                if step.finish_reason is not None:
                    yield chunks.choice(i, "", "length")
                continue
            n_outs[i] = step.num_output_tokens
            chunk = chunks.choice(i, step.text, step.finish_reason, lps=step.logprobs)
            if step.finish_reason is not None:
                n_open -= 1
                if not n_open:
                    last = chunk
                    continue
            yield chunk
    except Exception as e:  # noqa: BLE001 - the headers are sent: the error is an event, the detail logged
        last += sse(failure_body(e, "the request failed: ")[1])
    yield Tail(last + (chunks.usage(sum(n_outs), n_cached) if reply.include_usage else b"") + DONE)


async def _next(steps: AsyncIterator[tuple[int, Any]]) -> tuple[int, Any] | None:
    try:
        return await steps.__anext__()
    except StopAsyncIteration:
        return None


async def _then(first: asyncio.Future[tuple[int, Any] | None],
                steps: AsyncIterator[tuple[int, Any]]) -> AsyncIterator[tuple[int, Any]]:
    """``first``'s step, then the rest of ``steps``."""
    item = await first
    if item is None:
        return
    yield item
    async for item in steps:
        yield item


class Tail(bytes):
    """A stream's last events (its finishing chunk, the usage, ``[DONE]``) as one piece:
    ``EventStream`` sends it with the end of the body, one write where there were four."""


DONE = sse("[DONE]")



class EventStream(Response):
    """``body`` sent as server-sent events, stopped when the client leaves (its
    generator is closed there, so each choice's request is aborted). Starlette's
    StreamingResponse does the same with an anyio task group per response under
    uvicorn's ASGI 2.3 (about 170 us a response here, against 15)."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers(None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refused: StreamRefused | None = None
        try:
            with ClientWatch(receive):
                try:  # the first event before the headers: the request may be refused
                    first: bytes | None = await self.body_iterator.__anext__()
                except StopAsyncIteration:
                    first = None
                except StreamRefused as e:
                    refused = e
                    return
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                if first is not None and await _send_chunk(send, first):
                    return
                async for chunk in self.body_iterator:
                    if await _send_chunk(send, chunk):
                        return
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if refused is not None:
                status, error = failure_body(refused.error, "the request failed: ")
                await JSONResponse(error, status_code=status, headers=retry_headers(refused.error))(
                    scope, receive, send)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _send_chunk(send: Any, chunk: bytes) -> bool:
    """Send one event; True when it was the body's end (a ``Tail``)."""
    if type(chunk) is Tail:  # the body's end goes with it
        await send({"type": "http.response.body", "body": chunk, "more_body": False})
        return True
    if chunk:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    return False
