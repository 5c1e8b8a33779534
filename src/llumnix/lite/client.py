"""One request to an external OpenAI-compatible engine: the body, and its streamed reply
read as chunks.

What is sent: ``/v1/completions`` with the prompt the gateway already tokenized (a chat
already has its template applied). Engines that take token ids (vLLM, SGLang, our own
gateway) get the ids, so they prefill exactly what the gateway counted and indexed;
others get the ids decoded with special tokens kept, which their tokenizer parses back
into the same ids (OpenAI servers parse special-token text in completion prompts).

Every failure is an ``EndpointError`` saying whether the endpoint itself is to blame (a
health signal) and whether anything was received; the caller decides on a retry.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson

from llumnix.core.errors import LlumnixError
from llumnix.core.sampling_params import SamplingParams
from llumnix.lite.http import HttpError, HttpPool
from llumnix.lite.sse import LineTooLong, SseLines

TOKEN_PROMPTS = ("vllm", "sglang", "llumnix")
"""Engine kinds whose /v1/completions takes a prompt of token ids."""


class EndpointError(LlumnixError):
    def __init__(self, message: str, *, endpoint_fault: bool = True, refused: bool = False,
                 client_error: bool = False, fault: str = "") -> None:
        super().__init__(message)
        self.endpoint_fault = endpoint_fault
        """Counts against the endpoint's health (not a 4xx the request itself caused)."""
        self.refused = refused
        """The connection was refused: the engine is not there (ejects at once)."""
        self.client_error = client_error
        """The engine refused the request as invalid (4xx other than 408/429): no retry."""
        self.fault = fault
        """What the engine did wrong, where it answered something no sane engine does
        (a key of ``LiteBackend.engine_faults``; "" for plain failures)."""


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    """How long and how much of an engine's reply the gateway reads."""

    first_byte_timeout_s: float
    idle_timeout_s: float
    max_line_bytes: int
    """The longest SSE line (``lite.max_line_bytes``)."""

    def max_reply_bytes(self, max_tokens: int) -> int:
        """A whole reply's budget: two lines at the cap (vLLM's first chunk echoes the
        prompt's ids) and ``REPLY_BYTES_PER_TOKEN`` per token asked for."""
        return 2 * self.max_line_bytes + REPLY_BYTES_PER_TOKEN * max_tokens


REPLY_BYTES_PER_TOKEN = 4096
"""A streamed token's share of a reply's budget (vLLM's chunk for one token is about 300
bytes; the rest covers long tokens escaped as JSON, and keep-alive comments)."""
ERROR_BODY_BYTES = 64 << 10
"""How much of an error reply is read (its message is cut to 200 characters anyway)."""


@dataclass(slots=True)
class Chunk:
    """One streamed completion chunk, as far as the gateway needs it."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_completion_tokens: int | None = None
    """From the usage chunk (an integer, not yet checked against what was streamed)."""
    num_cached_tokens: int | None = None
    usage_error: str = ""
    """Why the usage the engine sent is not usable ("" where it is, or none came)."""


def request_body(model: str, kind: str, prompt: list[int] | str, params: SamplingParams) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": params.max_tokens,
                            "temperature": params.temperature, "top_p": params.top_p, "stream": True,
                            "n": 1}
    if kind != "llamacpp":
        body["stream_options"] = {"include_usage": True}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.presence_penalty:
        body["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        body["frequency_penalty"] = params.frequency_penalty
    if params.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if kind in TOKEN_PROMPTS:  # vLLM's extensions, which these share
        body.update(min_tokens=params.min_tokens, ignore_eos=params.ignore_eos,
                    repetition_penalty=params.repetition_penalty)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
    elif params.repetition_penalty != 1.0:
        body["repeat_penalty"] = params.repetition_penalty  # llama.cpp's name
    if kind == "vllm":
        body["return_token_ids"] = True  # newer vLLMs: the ids, so nothing is re-tokenized
    return body


USAGE_GRACE_S = 2.0
"""How long to wait after the finish chunk for the usage chunk and ``[DONE]``."""


async def stream_chunks(client: HttpPool, url: str, body: dict[str, Any], headers: dict[str, str],
                        limits: ReplyLimits) -> AsyncGenerator[Chunk, None]:
    """The reply's chunks, the finish chunk last, carrying the usage that follows it
    where the engine sends one (within ``USAGE_GRACE_S``: the answer is complete by then,
    so a failure, a delay or an oversized line past it only loses the usage). Lines and
    the whole reply are bounded (``limits``). The connection goes back to the pool at
    ``[DONE]``, its body's end read off the caller's path."""
    try:
        reply = await client.open(url + "/v1/completions", json_bytes(body), headers, limits.first_byte_timeout_s,
                                  limits.idle_timeout_s)
    except HttpError as e:
        raise EndpointError(str(e), refused=e.refused, fault=e.fault) from None
    except OSError as e:
        raise EndpointError(f"{type(e).__name__}: {e}") from None
    handed_off = False
    try:
        if reply.status != 200:
            raise _status_error(reply.status, (await reply.read(ERROR_BODY_BYTES))[:300].decode(errors="replace"))
        lines = SseLines(limits.max_line_bytes)
        budget = limits.max_reply_bytes(int(body["max_tokens"]))
        final: Chunk | None = None
        while True:
            try:
                data = await reply.body()
                batch = _feed(lines, data, budget) if data is not None else None
            except (HttpError, OSError, EndpointError) as e:
                if final is None:
                    raise
                # After the finish chunk it is only the usage that is lost, not the answer;
                # a late or cut one is no fault, an oversized one is.
                if isinstance(e, EndpointError):
                    final.usage_error = str(e)
                batch = None
            if batch is None:
                break
            for line in batch:
                if not line.startswith(b"data:"):
                    continue  # blank separators and ': keep-alive' comments
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    handed_off = True
                    reply.release_after_end()
                    if final is not None:
                        yield final
                    return
                if final is not None:
                    _take_usage(final, payload)
                    continue
                chunk = parse_chunk(payload)
                if chunk.finish_reason is not None:
                    final = chunk
                    reply.expire_at(asyncio.get_running_loop().time() + USAGE_GRACE_S)
                    continue
                reply.idle()
                yield chunk
        if final is not None:
            yield final
    except HttpError as e:
        raise EndpointError(str(e), refused=e.refused, fault=e.fault) from None
    except OSError as e:
        raise EndpointError(f"{type(e).__name__}: {e}") from None
    finally:
        if not handed_off:
            reply.release()


def _feed(lines: SseLines, data: bytes, budget: int) -> list[bytes]:
    try:
        batch = lines.feed(data)
    except LineTooLong as e:
        raise EndpointError(str(e), fault="oversized") from None
    if lines.num_bytes > budget:
        raise EndpointError(f"the endpoint's reply passed {budget} bytes (the budget for its max_tokens)",
                            fault="oversized")
    return batch


def _take_usage(final: Chunk, payload: bytes) -> None:
    """The usage chunk after the finish chunk: its figures (or why they are unusable) onto the finish chunk."""
    try:
        chunk = parse_chunk(payload)
    except EndpointError as e:
        final.usage_error = str(e)
        return
    if chunk.usage_error:
        final.usage_error = chunk.usage_error
    elif chunk.num_completion_tokens is not None:
        final.num_completion_tokens = chunk.num_completion_tokens
        final.num_cached_tokens = chunk.num_cached_tokens


def _status_error(status: int, text: str) -> EndpointError:
    detail = text
    with contextlib.suppress(ValueError, KeyError, TypeError):
        detail = json.loads(text)["error"]["message"]
    msg = f"HTTP {status}: {' '.join(str(detail).split())[:200]}"
    if 400 <= status < 500 and status not in (408, 429):
        return EndpointError(msg, endpoint_fault=False, client_error=True)
    return EndpointError(msg, endpoint_fault=status >= 500)


def parse_chunk(data: str | bytes) -> Chunk:
    """One ``data:`` payload; anything that is not a completion chunk is an EndpointError.
    Types are checked, not coerced: token ids are integers (their range is the caller's
    to check), and usage that is not integers is marked, not read."""
    try:
        obj = orjson.loads(data)
        if "error" in obj:
            err = obj["error"]
            raise EndpointError(f"the endpoint reported: {err.get('message', err) if isinstance(err, dict) else err}")
        out = Chunk()
        choices = obj.get("choices") or []
        if choices:
            c = choices[0]
            out.text = c.get("text") or ""
            out.finish_reason = c.get("finish_reason")
            out.stop_reason = c.get("stop_reason")
            ids = c.get("token_ids")
            if not isinstance(out.text, str) or not isinstance(out.finish_reason, str | None) or \
                    not isinstance(out.stop_reason, str | int | None) or isinstance(out.stop_reason, bool):
                raise TypeError("text, finish_reason or stop_reason is not a string")
            if ids is not None:
                if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                    raise TypeError("token_ids is not a list of integers")
                out.token_ids = ids
        usage = obj.get("usage")
        if usage:
            _read_usage(out, usage)
        return out
    except EndpointError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise EndpointError(f"the endpoint streamed something that is not a completion chunk "
                            f"({type(e).__name__}: {e}; {data[:80]!r})", fault="garbage") from None


def _read_usage(out: Chunk, usage: Any) -> None:
    if not isinstance(usage, dict):
        out.usage_error = f"usage is not an object ({usage!r:.40})"
        return
    n = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else details
    if type(n) is not int or type(cached) is not int:
        out.usage_error = f"usage is not integers (completion_tokens {n!r:.40}, cached_tokens {cached!r:.40})"
    else:
        out.num_completion_tokens, out.num_cached_tokens = n, cached


def json_bytes(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)
