"""Latency objectives in the local scheduler (opt-in: ``LocalScheduler.set_objectives``; the
``slo`` policy sets them from its classes, ``SLOConfig.engine_order``).

Per SLO class (by name: ``Request.slo_class``, which the request carries from its entry
and through migrations), a time-to-first-token objective and a time-per-output-token
objective; a request of no class with objectives has none. From them each request has a
deadline, and the queue and the preemption victims are ordered by ``key``: (overdue,
higher priority first, earlier deadline).

* A request still waiting for its first token must have it by arrival + TTFT. Past that it
  is **overdue**: it has missed for good, so it goes behind every request that can still
  meet its objectives and, once running, is preempted first (``overdue``, the rule alone).
* A request that has tokens (running, or preempted back into the queue) is on pace while
  now < first token + TPOT x its tokens so far: that is its deadline (``deadline``), so one
  with time banked yields to one whose first token is due sooner.
* With ``deadline``, a request waiting for its first token that memory stops may take the
  blocks of running requests whose keys come after its own (overdue ones, lower priority,
  or more time banked; ``victims``), so a burst gets its first tokens while the requests
  already decoding, far ahead of their TPOT pace, wait.

Without objectives the key is (False, -priority, arrival): the engine's plain order.

The trade-off of overdue-last: under sustained overload an overdue request waits behind
every request that can still meet its objectives, for as long as those keep arriving (in
the simulator's goal study, a median 44-50 s in its last seconds of overload). It bounds
no one's wait; a class that may be shed (``shed_share``) is the way to refuse such work
early instead of serving it late.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llumnix.core.request import Request

URGENT_SHARE = 0.5
"""A queued request may preempt for its first token once this share of its TTFT objective
has passed (before that, memory may yet free by itself)."""
ORDERS = ("fcfs", "overdue", "deadline")
"""``fcfs``: the plain order; ``overdue``: overdue requests last; ``deadline``: and by deadline,
with preemption for first tokens."""


@dataclass(frozen=True)
class Objectives:
    limits: Mapping[str, tuple[float, float]]
    """Per SLO class name: (TTFT, TPOT) objectives, seconds. A class not named has none."""
    by_deadline: bool = True
    """Order by deadline and preempt for first tokens (``deadline``); else overdue last only."""

    def due(self, req: Request) -> float | None:
        """When a request waiting for its first token becomes overdue (None: never, or already)."""
        lim = self.limits.get(req.slo_class)
        if lim is None or req.is_overdue or req.output_token_ids:
            return None
        return req.arrival_time + lim[0]

    def deadline(self, req: Request) -> float:
        lim = self.limits.get(req.slo_class)
        if lim is None or not self.by_deadline:
            return req.arrival_time
        n = len(req.output_token_ids)
        if not n:
            return req.arrival_time + lim[0]
        first = req.arrival_time if req.first_token_time is None else req.first_token_time
        return first + lim[1] * n

    def key(self, req: Request) -> tuple[bool, int, float]:
        return (req.is_overdue, -req.priority, self.deadline(req))

    def may_preempt_for(self, req: Request) -> bool:
        """``req`` (the head of the queue, stopped by memory) may take running requests' blocks."""
        return self.by_deadline and not req.is_overdue and not req.output_token_ids and req.slo_class in self.limits

    def victims(self, head: Request, running: Iterable[Request], now: float) -> list[Request]:
        """The running requests ``head`` may preempt, the first to go first (latest key):
        overdue ones and lower priorities at once; of its own priority, those due after it
        once it is urgent (``URGENT_SHARE`` of its TTFT objective has passed)."""
        k = self.key(head)
        urgent = now - head.arrival_time >= URGENT_SHARE * self.limits[head.slo_class][0]
        out = [r for r in running if (rk := self.key(r)) > k and (urgent or rk[:2] > k[:2])]
        return sorted(out, key=self.key, reverse=True)
