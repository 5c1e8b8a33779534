"""Incremental detokenization with stop strings, for streamed completions.

Decoding token by token breaks multi-byte characters and would leak the start
of a stop string before we know it is one, so text is released only when it
is settled: complete characters, and no tail that could still become a stop.
"""
from __future__ import annotations

from llumnix.core.stop import Detokenizer, find_stop, stop_floor


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Detokenizer, stop: tuple[str, ...] = (), min_tokens: int = 0) -> None:
        self._tok = tokenizer
        self._stop = stop
        self._min_tokens = min_tokens
        self._floor: int | None = 0 if min_tokens <= 1 else None
        """Characters of text a stop string may not end in (those of the first
        ``min_tokens`` - 1 tokens, as the engine rules); None until that many tokens came."""
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self._text = ""
        self._emitted = 0  # characters of self._text already released
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything released so far."""
        return self._text[: self._emitted]

    def add(self, token_ids: list[int], *, final: bool = False) -> str:
        """Add tokens; returns the newly settled text."""
        if self.stopped:
            return ""
        self.token_ids += token_ids
        text = self._tok.decode(self.token_ids)
        if self._floor is None and len(self.token_ids) >= self._min_tokens:
            self._floor = stop_floor(self._tok, self.token_ids, self._min_tokens - 1)
        hit = find_stop(text, self._stop, self._floor) if self._stop and self._floor is not None else None
        if hit is not None:
            text = text[: hit[0]]
            self.stopped = True
            final = True
        self._text = text
        end = len(text)
        if not final:
            while end > self._emitted and text[end - 1] == "\ufffd":
                end -= 1  # an incomplete UTF-8 sequence: wait for the next token
            end = max(self._emitted, end - self._hold)
        new = text[self._emitted:end]
        self._emitted = end
        return new
