"""OpenAI's response shapes: usage blocks, choices, stream chunks, and the two logprobs
shapes (the legacy completions one, and chat's). Pure: a token's text comes from the
``token_text`` function the caller passes."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

TokenLogprob = tuple[int, float, list[tuple[int, float]] | None]
"""A generated token, its logprob, and its most likely alternatives when asked for."""
EchoLogprob = tuple[int, float | None, list[tuple[int, float]] | None]
"""A token of a completions answer's logprobs: an echoed prompt's first token has none."""


@dataclass(frozen=True)
class LogprobFormat:
    """How one response writes logprobs."""

    token_text: Callable[[int], str]
    as_ids: bool = False
    """vLLM's ``return_tokens_as_token_ids``: tokens are named "token_id:N", which survives
    tokens whose text is not valid UTF-8 alone and lets a client map answers back to ids."""

    def label(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.token_text(token_id)

    def completion(self, lps: Sequence[EchoLogprob], offset: int) -> tuple[dict[str, Any], int]:
        """The legacy completions shape: per token its text, logprob and offset, and with
        ``logprobs`` = N > 0 the N most likely tokens by text, plus the chosen one (as
        OpenAI does: up to N + 1 entries). An echoed prompt's first token has no logprob
        (None), as in OpenAI's answers. Offsets count the tokens' text in any case; the
        second value is the offset after the last token."""
        texts = [self.token_text(t) for t, _, _ in lps]
        offsets, pos = [], offset
        for text in texts:
            offsets.append(pos)
            pos += len(text)
        tokens = [f"token_id:{t}" for t, _, _ in lps] if self.as_ids else texts
        tops = None
        if any(top is not None for _, _, top in lps):
            tops = [None if lp is None else {**{self.label(a): finite(alp) for a, alp in (top or ())}, tok: finite(lp)}
                    for tok, (_, lp, top) in zip(tokens, lps, strict=True)]
        return {"tokens": tokens, "token_logprobs": [None if lp is None else finite(lp) for _, lp, _ in lps],
                "top_logprobs": tops,
                "text_offset": offsets}, pos

    def chat(self, lps: Sequence[TokenLogprob]) -> dict[str, Any]:
        """Chat's shape: per token its label, logprob and UTF-8 bytes, and its alternatives."""
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            return {"token": self.label(token_id), "logprob": finite(lp),
                    "bytes": list(self.token_text(token_id).encode())}

        return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in (top or ())]}
                            for t, lp, top in lps]}


def echo_entries(prompt_token_ids: list[int], prompt_lps: Sequence[TokenLogprob] | None) -> list[EchoLogprob]:
    """An echoed prompt's logprobs entries: its first token (no logprob), then the rest."""
    return [(prompt_token_ids[0], None, None), *(prompt_lps or ())]


def usage(num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage block. The prompt counts once however many choices there are, as
    OpenAI counts it, and so do its cached tokens (those whose KV the prefix cache supplied)."""
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
            "total_tokens": num_prompt_tokens + num_output_tokens,
            "prompt_tokens_details": {"cached_tokens": num_cached_tokens}}


def response_body(response_id: str, model: str, created: int, choices: list[dict[str, Any]], *,
                  chat: bool, chunk: bool = False) -> dict[str, Any]:
    """The envelope of a whole answer or of one stream chunk."""
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": response_id, "object": obj, "created": created, "model": model, "choices": choices}


MIN_LOGPROB = -9999.0
"""What a logprob of a token that cannot be drawn (-inf) is written as: JSON has no
infinity (vLLM writes the same)."""


def finite(lp: float) -> float:
    return lp if lp > MIN_LOGPROB else MIN_LOGPROB  # NaN too: it compares false


def json_bytes(obj: Any) -> bytes:
    """JSON, fast (orjson: several times the standard library's speed on these bodies)."""
    return orjson.dumps(obj)


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event; ``[DONE]`` is the stream's last."""
    return b"data: " + (payload.encode() if isinstance(payload, str) else orjson.dumps(payload)) + b"\n\n"
