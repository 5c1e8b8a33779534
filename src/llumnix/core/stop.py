"""Stop-string matching shared by the engine (to stop) and the frontends (to cut text)."""
from __future__ import annotations

from typing import Protocol


class Detokenizer(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


def stop_floor(tokenizer: Detokenizer, token_ids: list[int], num_early: int) -> int:
    """The ``floor`` for ``find_stop``: characters of the text of the first ``num_early``
    of ``token_ids``, tokens a stop string may not end in (with ``min_tokens``, the
    output's first min_tokens - 1); 0 when there are none."""
    return len(tokenizer.decode(token_ids[:num_early])) if num_early > 0 else 0


def find_stop(text: str, stops: tuple[str, ...], floor: int = 0) -> tuple[int, str] | None:
    """Earliest stop string in ``text`` that ends beyond its first ``floor`` characters
    (the text of tokens that may not end the output: ``min_tokens``): (index, stop) or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, max(0, floor - len(s) + 1))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
