"""Text to token ids at the edge: prompts, and chats through the model's chat template."""
from __future__ import annotations

from llumnix.gateway.context import GatewayContext
from llumnix.gateway.protocol import ChatMessage


def encode_prompt(ctx: GatewayContext, text: str, add_special_tokens: bool = True) -> list[int]:
    return ctx.backend.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def encode_chat(ctx: GatewayContext, messages: list[ChatMessage]) -> list[int]:
    """The token ids a chat prefills: the messages through the model's chat template."""
    tokenizer = ctx.backend.tokenizer
    text = tokenizer.apply_chat_template([msg.model_dump() for msg in messages])
    return tokenizer.encode(text, add_special_tokens=False)


def decode(ctx: GatewayContext, token_ids: list[int]) -> str:
    return ctx.backend.tokenizer.decode(token_ids)
