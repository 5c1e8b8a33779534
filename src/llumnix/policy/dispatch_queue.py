"""The order in which pending requests are dispatched: higher scheduling priority
first, first-come-first-serve within a priority (the paper's dispatching rule)."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DispatchRequest:
    """What dispatch needs to know about a new request."""

    request_id: str
    num_prompt_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    prompt_token_ids: Sequence[int] | None = None
    """The prompt itself, for prefix affinity (``policy/prefix_affinity.py``); None where
    the caller has no tokens (the simulator's traces are lengths only)."""
    slo_class: str | None = None
    """The request's SLO class by name (None: its priority's, ``policy/slo.py``)."""


def dispatch_order(req: DispatchRequest) -> tuple[int, float]:
    """Sort key: higher priority first, then earlier arrival."""
    return (-req.priority, req.arrival_time)


class DispatchQueue:
    """Requests waiting for dispatch, popped in ``dispatch_order``; equal keys in push order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, DispatchRequest]] = []
        self._seq = itertools.count()

    def push(self, req: DispatchRequest) -> None:
        heapq.heappush(self._heap, (*dispatch_order(req), next(self._seq), req))

    def pop(self) -> DispatchRequest:
        return heapq.heappop(self._heap)[-1]

    def peek(self) -> DispatchRequest:
        return self._heap[0][-1]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[DispatchRequest]:
        """In dispatch order, without removing anything."""
        return (item[-1] for item in sorted(self._heap))
