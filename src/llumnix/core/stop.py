"""Stop-string matching shared by the engine (to stop) and the frontends (to cut text)."""
from __future__ import annotations

from typing import Protocol


class Detokenizer(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


def find_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Earliest stop string in ``text``: (index, stop) or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best
