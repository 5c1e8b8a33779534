"""Per-client fair share of the choices in flight: a virtual token counter (VTC, Sheng et
al., OSDI'24 "Fairness in Serving Large Language Models") over the clients of a gateway.

At most ``max_in_flight`` choices are served at once; beyond that, a choice waits in its
client's FCFS queue, and a freed place goes to the head of the queue of the backlogged
client with the smallest counter. A client's counter grows with the service it received:
``prompt_weight`` a prompt token when a choice starts, ``output_weight`` an output token as
it streams. A client that comes back after an idle spell has its counter lifted to the
smallest one among the clients being served or waiting, so it cannot bank credit from its
absence. What this bounds: a client with a lot of costly work queued delays another client's
choice by at most the time for one of the places it holds to free up, not by its whole backlog
(which FCFS would put first). Work-conserving: a lone client gets every place.

Pure: no clock, no I/O; the gateway's ``FairGate`` wraps it for asyncio.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_IDLE_CLIENTS = 4096
"""Counters kept beyond the active clients'; past it, every idle client's is forgotten."""


@dataclass(frozen=True)
class FairConfig:
    max_in_flight: int
    """Choices served at once from this gateway, over all clients (beyond: they queue)."""
    prompt_weight: float = 1.0
    """A client's counter grows this much a prompt token it is served (VTC's w_p)."""
    output_weight: float = 2.0
    """...and this much an output token (VTC's w_q: a decode step costs more than a prefill token)."""

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.prompt_weight < 0 or self.output_weight < 0:
            raise ValueError(f"fair share: max_in_flight must be positive and weights non-negative: {self}")


class FairShare:
    """The VTC's books: counters, each client's queue of tickets, the places in use."""

    def __init__(self, config: FairConfig) -> None:
        self.config = config
        self.counters: dict[str, float] = {}
        self._queues: dict[str, deque[int]] = {}
        self._serving: dict[str, int] = {}
        self.num_in_flight = 0

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def arrive(self, client: str, ticket: int) -> bool:
        """A choice of ``client`` asks for a place: True if it has one now, False if it
        waits (``finish`` hands it one later)."""
        if client not in self._queues and client not in self._serving:
            self._lift(client)
        if not self._queues and self.num_in_flight < self.config.max_in_flight:
            self._start(client)
            return True
        self._queues.setdefault(client, deque()).append(ticket)
        return False

    def cancel(self, client: str, ticket: int) -> bool:
        """A waiting choice leaves (its client hung up): False if it was not waiting."""
        q = self._queues.get(client)
        if q is None or ticket not in q:
            return False
        q.remove(ticket)
        if not q:
            del self._queues[client]
            self._maybe_forget(client)
        return True

    def finish(self, client: str) -> list[tuple[str, int]]:
        """A served choice of ``client`` ended: the (client, ticket) pairs that now have a place."""
        self.num_in_flight -= 1
        left = self._serving[client] - 1
        if left:
            self._serving[client] = left
        else:
            del self._serving[client]
            self._maybe_forget(client)
        started = []
        while self._queues and self.num_in_flight < self.config.max_in_flight:
            nxt = min(self._queues, key=lambda c: self.counters[c])  # ties: the longest backlogged
            q = self._queues[nxt]
            ticket = q.popleft()
            if not q:
                del self._queues[nxt]
            self._start(nxt)
            started.append((nxt, ticket))
        return started

    def charge(self, client: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        self.counters[client] = self.counters.get(client, 0.0) + (
            self.config.prompt_weight * prompt_tokens + self.config.output_weight * output_tokens)

    def _start(self, client: str) -> None:
        self.num_in_flight += 1
        self._serving[client] = self._serving.get(client, 0) + 1

    def _maybe_forget(self, client: str) -> None:
        """Drop an idle client's counter when its return would lift it to where it starts
        anyway (at or below every active client's), so a stream of new client names costs
        no memory once served."""
        if client in self._queues or client in self._serving:
            return
        active = [self.counters[c] for c in (*self._queues, *self._serving)]
        if active and self.counters[client] <= min(active):
            del self.counters[client]
        elif len(self.counters) > MAX_IDLE_CLIENTS:  # the rest: a bound, at some cost in fairness
            for c in [c for c in self.counters if c not in self._queues and c not in self._serving]:
                del self.counters[c]

    def _lift(self, client: str) -> None:
        others = [self.counters[c] for c in (*self._queues, *self._serving) if c != client]
        self.counters[client] = max(self.counters.get(client, 0.0), min(others, default=0.0))

    def check_invariants(self) -> None:
        assert self.num_in_flight == sum(self._serving.values()) <= self.config.max_in_flight
        assert all(self._queues.values()) and all(n > 0 for n in self._serving.values())
        assert not self._queues or self.num_in_flight == self.config.max_in_flight  # work-conserving
        assert all(c in self.counters for c in (*self._queues, *self._serving))
