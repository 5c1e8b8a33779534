"""Python's cyclic garbage collector in an instance process.

A full (generation-2) collection walks every tracked object: in an instance with
SmolLM2 loaded that is ~177k objects and ~100 ms with the GIL held, i.e. a stall of
the step thread of up to half a decode step, at moments set by allocation counts (a
migration's snapshot and block lists can tip one). Everything built at start-up
(the model, the tokenizer, Ray's worker state) lives as long as the process, so an
instance freezes it (``gc.freeze``): full collections then walk only what was made
since, and take well under a millisecond. ``GCWatch`` counts the full collections
that remain and their time, so the benchmarks can show it.
"""
from __future__ import annotations

import gc
import os
import time
from typing import Any


def freeze_startup_objects() -> int:
    """Collect once, then move every surviving object to the permanent generation
    (unless ``LLUMNIX_GC_FREEZE=0``). Returns how many objects were frozen."""
    if os.environ.get("LLUMNIX_GC_FREEZE", "1") == "0":
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GCWatch:
    """Counts full collections in this process and the seconds they took."""

    def __init__(self) -> None:
        self.num_full = 0
        self.full_s = 0.0
        self.max_full_s = 0.0
        self._started: float | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took = time.perf_counter() - self._started
            self._started = None
            self.num_full += 1
            self.full_s += took
            self.max_full_s = max(self.max_full_s, took)

    def stats(self) -> dict[str, Any]:
        return {"num_full": self.num_full, "full_s": self.full_s, "max_full_s": self.max_full_s,
                "frozen": gc.get_freeze_count()}

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
