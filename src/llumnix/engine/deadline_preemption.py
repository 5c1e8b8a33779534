"""A queued first token's preemption by the SLO classes' deadlines: one role of the local
scheduler (``engine/scheduler.py``), with the ``deadline`` order (``engine/objectives.py``).

The head of the queue, waiting for its first token, may take what stops it from running
requests whose keys come after its own (``Objectives.victims``: overdue ones and lower
priorities at once, its own priority's requests with more time banked once it is urgent):

* blocks, when memory stops it (``for_blocks``): the latest first, and none unless all of
  them would make room;
* a place, when the batch is full (``max_num_seqs``; ``for_place``): the latest one. A full
  batch stops a first token as memory does: without this, requests with time banked would
  hold every place while a first token due sooner waits out their ends. No measured run has
  had it act yet (benchmarks/slo/README.md: goal.yaml's and the fair point's caps never bind,
  and a single-class CPU run at 0.85 load preempted nothing).

Not with prefix caching: a victim's blocks may be the head's cached prefix. The victims go
back to the queue (recompute), behind the head; the step reports them as preempted.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llumnix.core.request import Request
from llumnix.engine.objectives import Objectives

if TYPE_CHECKING:
    from llumnix.engine.scheduler import LocalScheduler


class DeadlinePreemption:
    def __init__(self, sched: LocalScheduler, objectives: Objectives, now: Callable[[], float]) -> None:
        self.sched = sched
        self.objectives = objectives
        self.now = now
        self.victims: list[str] = []
        """Requests preempted since the step's output last took them (``take_victims``)."""
        self.num_preempted = 0
        """Running requests preempted so that a queued request gets its first token in time."""

    @property
    def enabled(self) -> bool:
        return self.sched.kv.prefix is None

    def take_victims(self) -> list[str]:
        out, self.victims = self.victims, []
        return out

    def _victims_of(self, req: Request) -> list[Request]:
        if not self.enabled or not self.objectives.may_preempt_for(req):
            return []
        return self.objectives.victims(req, self.sched.running, self.now())

    def _preempt(self, victim: Request) -> None:
        self.sched.preempt(victim)
        self.victims.append(victim.request_id)
        self.num_preempted += 1

    def for_blocks(self, req: Request, cached: tuple[list[int], bytes] | None) -> bool:
        """Memory stops the head ``req``: preempt the running requests after it (latest
        first) if their blocks make it fit; whether it fits."""
        victims = self._victims_of(req)
        kv = self.sched.kv
        need = kv.blocks_needed(req.num_tokens, cached)
        if not victims or kv.num_free_blocks + sum(len(kv.tables[v.request_id]) for v in victims) - need \
                < kv.num_watermark_blocks:
            return False  # all of them would not make room: preempt none
        while victims and not kv.can_allocate(req.num_tokens, cached):
            self._preempt(victims.pop(0))
        return kv.can_allocate(req.num_tokens, cached)

    def for_place(self, req: Request) -> bool:
        """The batch is full: the running request after the head ``req`` that comes last in
        the service order goes back to the queue; whether one did."""
        victims = self._victims_of(req)
        if victims:
            self._preempt(victims[0])
        return bool(victims)

    def for_head(self) -> None:
        """Chunked prefill: the head that a full batch or memory stops preempts before the
        step's decodes are taken (the admission runs after them; issue 47's fair point)."""
        sched = self.sched
        head = sched.waiting[0]
        if len(sched.running) >= sched.config.max_num_seqs and not self.for_place(head):
            return
        if not sched.kv.can_allocate(head.num_tokens):
            self.for_blocks(head, None)
