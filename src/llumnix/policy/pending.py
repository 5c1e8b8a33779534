"""Requests the scheduler has dispatched but no status report has shown yet.

Statuses arrive every ~50 ms; at 36 req/s a burst of requests lands between
two reports. Dispatching each against the same stale snapshot would send the
whole burst to one instance. So each dispatched request is added to its
instance's view as a running request holding its prompt's blocks (it adds to
sum V, to B, to the used blocks and to the request count), until a report
shows it, the dispatcher learns it finished (a gateway sees its last output), or a
report is ``grace_s`` newer than the dispatch (it finished unseen, or was lost).

    report t0      dispatch r1, r2 (pending on i0, i1)      report t1 shows r1
        |-----------------x----x--------------------------------|
    view(i0) = status(t0) + r1 until t1; after t1 the engine's own count of r1.
"""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy.dispatch_queue import DispatchRequest
from llumnix.policy.freeness import blocks_for


@dataclass(frozen=True)
class _Pending:
    dispatched_at: float
    brief: RequestBrief


class PendingDispatches:
    def __init__(self) -> None:
        self._by_instance: dict[str, list[_Pending]] = {}

    def add(self, instance_id: str, req: DispatchRequest, block_size: int, now: float) -> None:
        brief = RequestBrief(req.request_id, req.priority, blocks_for(req.num_prompt_tokens, block_size),
                             req.num_prompt_tokens, req.arrival_time, is_running=True,
                             slo_class=req.slo_class or "")
        self._by_instance.setdefault(instance_id, []).append(_Pending(now, brief))

    def on_status(self, status: InstanceStatus, grace_s: float) -> None:
        """Forget the requests this report accounts for (or must have, given its age)."""
        pend = self._by_instance.get(status.instance_id)
        if not pend:
            return
        seen = {r.request_id for r in status.running} | {r.request_id for r in status.waiting}
        self._by_instance[status.instance_id] = [
            p for p in pend
            if p.brief.request_id not in seen and status.timestamp < p.dispatched_at + grace_s]

    def forget(self, instance_id: str, request_id: str) -> bool:
        """``request_id`` finished on ``instance_id`` (whose report of that is in hand):
        no longer counted. False if it was not pending there."""
        pend = self._by_instance.get(instance_id)
        if not pend:
            return False
        kept = [p for p in pend if p.brief.request_id != request_id]
        self._by_instance[instance_id] = kept
        return len(kept) != len(pend)

    def remove_instance(self, instance_id: str) -> None:
        self._by_instance.pop(instance_id, None)

    def num_pending(self, instance_id: str) -> int:
        return len(self._by_instance.get(instance_id, ()))

    def apply(self, status: InstanceStatus) -> InstanceStatus:
        """The status with this instance's pending requests counted as running."""
        pend = self._by_instance.get(status.instance_id)
        if not pend:
            return status
        briefs = tuple(p.brief for p in pend)
        return status.with_running(briefs, sum(b.num_blocks for b in briefs))
