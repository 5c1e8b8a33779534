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

TOKEN_PROMPTS = ("vllm", "sglang", "llumnix")
"""Engine kinds whose /v1/completions takes a prompt of token ids."""


class EndpointError(LlumnixError):
    def __init__(self, message: str, *, endpoint_fault: bool = True, refused: bool = False,
                 client_error: bool = False) -> None:
        super().__init__(message)
        self.endpoint_fault = endpoint_fault
        """Counts against the endpoint's health (not a 4xx the request itself caused)."""
        self.refused = refused
        """The connection was refused: the engine is not there (ejects at once)."""
        self.client_error = client_error
        """The engine refused the request as invalid (4xx other than 408/429): no retry."""


@dataclass(slots=True)
class Chunk:
    """One streamed completion chunk, as far as the gateway needs it."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_completion_tokens: int | None = None
    """From the usage chunk."""
    num_cached_tokens: int | None = None


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
                        first_byte_timeout_s: float, idle_timeout_s: float) -> AsyncGenerator[Chunk, None]:
    """The reply's chunks, the finish chunk last, carrying the usage that follows it
    where the engine sends one (within ``USAGE_GRACE_S``: the answer is complete by then,
    so a failure or a delay past it only loses the usage). The connection goes back to
    the pool at ``[DONE]``, its body's end read off the caller's path."""
    try:
        reply = await client.open(url + "/v1/completions", json_bytes(body), headers, first_byte_timeout_s,
                                  idle_timeout_s)
    except HttpError as e:
        raise EndpointError(str(e), refused=e.refused) from None
    except OSError as e:
        raise EndpointError(f"{type(e).__name__}: {e}") from None
    handed_off = False
    try:
        if reply.status != 200:
            raise _status_error(reply.status, (await reply.read())[:300].decode(errors="replace"))
        rest = b""
        final: Chunk | None = None
        while True:
            try:
                data = await reply.body()
            except (HttpError, OSError):
                if final is None:
                    raise
                data = None  # after the finish chunk: the usage is lost, not the answer
            if data is None:
                break
            *lines, rest = (rest + data).split(b"\n") if rest else data.split(b"\n")
            for line in lines:
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
                    with contextlib.suppress(EndpointError):
                        _take_usage(final, parse_chunk(payload))
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
        raise EndpointError(str(e), refused=e.refused) from None
    except OSError as e:
        raise EndpointError(f"{type(e).__name__}: {e}") from None
    finally:
        if not handed_off:
            reply.release()


def _take_usage(final: Chunk, chunk: Chunk) -> None:
    if chunk.num_completion_tokens is not None:
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
    """One ``data:`` payload; anything that is not a completion chunk is an EndpointError."""
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
            if not isinstance(out.text, str):
                raise TypeError("text is not a string")
            out.finish_reason = c.get("finish_reason")
            out.stop_reason = c.get("stop_reason")
            ids = c.get("token_ids")
            out.token_ids = [int(t) for t in ids] if isinstance(ids, list) else None
        usage = obj.get("usage")
        if usage:
            out.num_completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            out.num_cached_tokens = int(details.get("cached_tokens") or 0)
        return out
    except EndpointError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise EndpointError(f"the endpoint streamed something that is not a completion chunk "
                            f"({type(e).__name__}: {data[:80]!r})") from None


def json_bytes(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body)
