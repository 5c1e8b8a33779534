"""LlumSched's logic: dispatch (scheduler role), migration pairing and scaling
(rescheduler role) over the latest statuses. Plain object: the runtime and the
simulator call it; it reads no clock and does no I/O."""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from dataclasses import dataclass

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy.config import SchedulingConfig
from llumnix.policy.dispatch import make_pipeline
from llumnix.policy.freeness import normal_freeness
from llumnix.policy.pairing import MigrationOrder, pair_migrations
from llumnix.policy.pipeline import DispatchContext
from llumnix.policy.scaling import NO_ACTION, ScaleAction, scaling_decision


@dataclass(frozen=True)
class DispatchRequest:
    request_id: str
    num_prompt_tokens: int
    priority: int = 0
    arrival_time: float = 0.0


class DispatchQueue:
    """Requests waiting for dispatch: higher scheduling priority first, FCFS within."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, DispatchRequest]] = []
        self._seq = itertools.count()

    def push(self, req: DispatchRequest) -> None:
        heapq.heappush(self._heap, (-req.priority, req.arrival_time, next(self._seq), req))

    def pop(self) -> DispatchRequest:
        return heapq.heappop(self._heap)[-1]

    def peek(self) -> DispatchRequest:
        return self._heap[0][-1]

    def __len__(self) -> int:
        return len(self._heap)


@dataclass
class _Pending:
    dispatched_at: float
    brief: RequestBrief


class GlobalScheduler:
    def __init__(self, config: SchedulingConfig | None = None, seed: int = 0) -> None:
        self.config = config or SchedulingConfig()
        self.pipeline = make_pipeline(self.config.dispatch.policy, self.config.dispatch.params)
        self.statuses: dict[str, InstanceStatus] = {}
        self.sent: dict[str, int] = {}
        self._pending: dict[str, list[_Pending]] = {}
        self._rng = random.Random(seed)
        self._freeness_samples: list[tuple[float, float]] = []
        self._last_scale: float | None = None

    # -- membership ----------------------------------------------------------
    def add_instance(self, status: InstanceStatus) -> None:
        self.statuses[status.instance_id] = status
        self.sent.setdefault(status.instance_id, 0)
        self._pending.setdefault(status.instance_id, [])

    def remove_instance(self, instance_id: str) -> None:
        self.statuses.pop(instance_id, None)
        self.sent.pop(instance_id, None)
        self._pending.pop(instance_id, None)

    def update_status(self, status: InstanceStatus) -> None:
        old = self.statuses.get(status.instance_id)
        if old is not None and status.timestamp < old.timestamp:
            return  # a late report never rolls the view back
        self.statuses[status.instance_id] = status
        # A dispatched request stops being an estimate once the instance reports it,
        # or once a report is late enough that it must have included it.
        seen = {r.request_id for r in status.running} | {r.request_id for r in status.waiting}
        grace = self.config.dispatch.pending_grace_s
        pend = self._pending.get(status.instance_id, [])
        self._pending[status.instance_id] = [
            p for p in pend
            if p.brief.request_id not in seen and status.timestamp < p.dispatched_at + grace]

    # -- scheduler role --------------------------------------------------------
    def view(self) -> list[InstanceStatus]:
        """Statuses as dispatch should see them: with requests sent since each
        report counted as running, so a burst between two reports spreads out
        instead of landing on one instance."""
        out = []
        for iid, s in self.statuses.items():
            pend = self._pending.get(iid)
            if pend:
                s = dataclasses.replace(s, running=s.running + tuple(p.brief for p in pend))
            out.append(s)
        return out

    def dispatch(self, req: DispatchRequest, now: float) -> str | None:
        cfg = self.config
        ctx = DispatchContext(now=now, freeness=cfg.freeness, staleness_s=cfg.dispatch.staleness_s,
                              sent=self.sent, rng=self._rng)
        iid = self.pipeline.pick(self.view(), ctx)
        if iid is None:
            return None
        self.sent[iid] += 1
        s = self.statuses[iid]
        blocks = -(-req.num_prompt_tokens // s.block_size)
        self._pending[iid].append(_Pending(now, RequestBrief(
            req.request_id, req.priority, blocks, req.num_prompt_tokens, req.arrival_time, True)))
        return iid

    # -- rescheduler role --------------------------------------------------------
    def reschedule(self, now: float) -> list[MigrationOrder]:
        cfg = self.config
        if not cfg.rescheduling.enabled:
            return []
        return pair_migrations(list(self.statuses.values()), cfg.rescheduling, cfg.freeness)

    def record_freeness(self, now: float) -> float:
        """Sample the average normal-priority freeness for auto-scaling."""
        live = [s for s in self.statuses.values() if not s.is_terminating]
        avg = sum(normal_freeness(s, self.config.freeness) for s in live) / max(1, len(live))
        self._freeness_samples.append((now, avg))
        # Two windows of history: enough to tell that a full window has been observed.
        horizon = now - 2 * self.config.scaling.window_s
        while self._freeness_samples[0][0] < horizon:
            self._freeness_samples.pop(0)
        return avg

    def scaling_decision(self, now: float) -> ScaleAction:
        act = scaling_decision(self._freeness_samples, list(self.statuses.values()),
                               self.config.scaling, now, self._last_scale)
        if act is not NO_ACTION and act.kind != "none":
            self._last_scale = now
            self._freeness_samples.clear()
        return act
