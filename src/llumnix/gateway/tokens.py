"""Text to token ids at the edge, and back. What is cheap is checked first (valid
Unicode; a length the bytes alone prove too long, which then is never tokenized), and
large inputs are (de)tokenized in a worker thread so the event loop keeps serving."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from llumnix.core.errors import InvalidRequestError, RequestTooLongError
from llumnix.gateway.context import GatewayContext
from llumnix.gateway.protocol import ChatMessage

T = TypeVar("T")


def utf8_size(text: str, param: str) -> int:
    """Bytes of ``text`` in UTF-8; a lone UTF-16 surrogate (JSON allows "\\ud800") is the
    client's error, not one to find deep in a tokenizer."""
    try:
        return len(text.encode())
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"{param} is not valid Unicode: a lone surrogate "
                                  f"{text[e.start]!r} at character {e.start}", param) from None


MESSAGE_BYTES = 16
"""What a chat message weighs beyond its content when the gateway decides whether to render
it off the event loop: the template's role markers, and the message object itself."""


def check_size(ctx: GatewayContext, num_bytes: int, param: str, at_least: int = 0) -> None:
    """Refuse a text whose bytes prove it longer than the context: each token covers at
    most ``max_token_bytes`` bytes of it. ``at_least``: tokens it has whatever its bytes
    (a chat: one a message, its role marker)."""
    per_token = ctx.backend.tokenizer.max_token_bytes
    if per_token is not None:
        at_least = max(at_least, -(-num_bytes // per_token))
    context_len = ctx.backend.max_model_len
    if at_least > context_len:
        raise RequestTooLongError(f"the {param} has at least {at_least} tokens ({num_bytes} bytes); this "
                                  f"model's context is {context_len} tokens", param)


async def _run(ctx: GatewayContext, size: int, fn: Callable[..., T], *args: object) -> T:
    if size > ctx.config.offload_bytes:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def encode_prompt(ctx: GatewayContext, text: str, add_special_tokens: bool = True,
                        bounded: bool = True) -> list[int]:
    """``bounded``: refuse, untokenized, a prompt too long for the context."""
    size = utf8_size(text, "prompt")
    if bounded:
        check_size(ctx, size, "prompt")
    return await _run(ctx, size, ctx.backend.tokenizer.encode, text, add_special_tokens)


async def encode_chat(ctx: GatewayContext, messages: list[ChatMessage], bounded: bool = True) -> list[int]:
    """The token ids a chat prefills: its messages through the model's chat template. A
    message renders to at least one token however empty its content, so the count of
    messages bounds the template's work as the bytes do (250,000 empty messages are a
    long chat, not a short one)."""
    size = sum(utf8_size(m.content, "messages") for m in messages)
    if bounded:
        check_size(ctx, size, "messages", at_least=len(messages))
    size += MESSAGE_BYTES * len(messages)
    return await _run(ctx, size, _render_chat, ctx, messages)


def _render_chat(ctx: GatewayContext, messages: list[ChatMessage]) -> list[int]:
    return ctx.backend.tokenizer.encode_chat([m.model_dump() for m in messages])


async def decode(ctx: GatewayContext, token_ids: list[int]) -> str:
    return await _run(ctx, 4 * len(token_ids), ctx.backend.tokenizer.decode, token_ids)
