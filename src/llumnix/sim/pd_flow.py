"""Prefill-decode disaggregation in the simulator: hand-offs and adaptive role changes.

The policy is ``policy/pd.py``'s (pure); this drives it on the simulated instances::

    prefill instance's step boundary (before its next step is scheduled) ─► every
        request there with its first token and not migrating ─► pick_decode_instance ─►
        MigrationRun ─► decode instance:
          the instance has queued prompts (its next step is a prefill the request is not
            in): paused at once, every block copied in one fused stage (stop-and-copy)
          otherwise: the live migration, pre-copy stages while it keeps decoding here,
            then a short last stage
    no decode instance has room ─► the request keeps decoding on its prefill instance;
        offered again at the next status round (and the next step end after one)
    status round (PD reads every one) ─► adaptive_decisions ─► set_role (several lends
        at once); with ``rebalance_queued``, queue_moves ─► queued prompts migrate (metadata
        only) to the least queued prefill-taking instances; hand-offs retried

A hand-off that aborts (the destination refused the reservation, the request finished
or was preempted meanwhile) leaves the request where it was, its blocks accounted on
both sides by the same MigrationRun as any migration; it is offered again later.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llumnix.core.request import RequestStatus
from llumnix.policy.cluster_view import Role
from llumnix.policy.freeness import freeness
from llumnix.policy.pd import (
    PoolView,
    RoleChange,
    adaptive_decisions,
    pick_decode_instance,
    queue_moves,
    queued_prefill_tokens,
)
from llumnix.sim.events import Event
from llumnix.sim.migration import MigrationRun

if TYPE_CHECKING:
    from llumnix.migration.protocol import MigrationConfig
    from llumnix.sim.cluster import Cluster
    from llumnix.sim.instance import SimInstance
    from llumnix.sim.latency import MigrationCost
    from llumnix.sim.policy_bridge import PolicyBridge


class PDFlow:
    def __init__(self, policy: PolicyBridge, cluster: Cluster, migration: MigrationConfig, cost: MigrationCost,
                 on_started: Callable[[], None], on_finished: Callable[[MigrationRun, float], list[Event]]) -> None:
        self.policy = policy
        self.config = policy.config.pd
        self.cluster = cluster
        self.migration = migration
        self.cost = cost
        self._on_started = on_started
        self._on_finished = on_finished
        self.last_change: float | None = None
        self._full = False
        """The last hand-off attempt found the decode pool full (cleared each round)."""
        self.counts = {"handoffs": 0, "handoffs_aborted": 0, "handoffs_deferred": 0, "handoffs_paused": 0,
                       "lends": 0, "reclaims": 0, "flips": 0, "queue_moves": 0, "queue_moves_aborted": 0}
        self._stop_and_copy = dataclasses.replace(migration, max_stages=1)
        self._fused = dataclasses.replace(cost, blocking_bandwidth=None)
        """A stop-and-copy hand-off sends the blocks in one fused copy (the bandwidth of a
        pre-copy stage), not the paper's unfused blocking baseline."""
        self.handoff_downtimes: list[float] = []
        self.recent: deque[Any] = deque(maxlen=50)
        """The last committed hand-offs' reports (``simulate --live`` shows them, as LlumSched's ``pd``)."""
        self.changes: list[tuple[float, str, str, str]] = []
        """(time, instance, new role, reason) of every role change."""

    # -- hand-offs -------------------------------------------------------------------
    def on_report(self, instance_id: str) -> None:
        """A report counts every hand-off's blocks promised to it before."""
        self.policy.cluster.promised.pop(instance_id, None)

    def at_boundary(self, inst: SimInstance, now: float) -> list[Event]:
        """``SimInstance.on_boundary`` of every instance."""
        if self._full or self.policy.cluster.role_of(inst.instance_id) != Role.PREFILL:
            return []
        return self._handoffs(inst, now)

    def _handoffs(self, src: SimInstance, now: float) -> list[Event]:
        events: list[Event] = []
        statuses = list(self.policy.gs_decode.statuses.values())
        fcfg, promised = self.policy.config.freeness, self.policy.cluster.promised
        kv = src.engine.kv
        for rid, req in list(src.engine.requests.items()):
            if req.status != RequestStatus.RUNNING or not req.output_token_ids or rid in src.migrations_out:
                continue
            blocks = kv.num_blocks_of(rid)
            dst_id = pick_decode_instance(statuses, self.policy.roles, blocks, self.config,
                                          lambda s: freeness(s, fcfg), promised, exclude=src.instance_id)
            if dst_id is None:
                self._full = True
                self.counts["handoffs_deferred"] += 1
                break
            dst = self.cluster.instances[dst_id]
            promised[dst_id] = promised.get(dst_id, 0) + blocks + self.config.growth_blocks
            # A queued prompt means the next step is a prefill the request is not in: pause it
            # now rather than pre-copy while it waits out that step at the source.
            pause = bool(src.engine.scheduler.waiting) and not src.is_busy
            if pause:
                self.counts["handoffs_paused"] += 1
            run = MigrationRun(src, dst, rid, self._stop_and_copy if pause else self.migration,
                               self._fused if pause else self.cost, now, on_done=self._done)
            events += self._launch(run, now)
        return events

    def _done(self, run: MigrationRun, now: float) -> list[Event]:
        run.src.llumlet.on_migration_finished(run.request_id, run.protocol.report().committed)
        if run.protocol.report().committed:
            self.counts["handoffs"] += 1
            run.on_report(self._record)
        else:
            self.counts["handoffs_aborted"] += 1
        return self._on_finished(run, now)

    def _record(self, report: Any) -> None:
        self.recent.append(report)
        if report.downtime is not None:
            self.handoff_downtimes.append(report.downtime)

    # -- rounds ------------------------------------------------------------------------
    def on_round(self, now: float) -> list[Event]:
        """A status round: adaptive PD's decision, then every prefill instance's hand-offs."""
        self._full = False
        for change in adaptive_decisions(self._view(), self.config, now, self.last_change):
            self.apply(change, now)
        events: list[Event] = []
        if self.config.mode == "adaptive" and self.config.rebalance_queued:
            events += self._rebalance(now)
        for iid, role in sorted(self.policy.roles.items()):
            inst = self.cluster.instances.get(iid)
            if role == Role.PREFILL and inst is not None and not self._full:
                events += self._handoffs(inst, now)
        return events

    def _rebalance(self, now: float) -> list[Event]:
        """Queued prompts from the most queued prefill-taking instances to the least."""
        takers = {i: self.cluster.instances[i] for i, r in self.policy.roles.items()
                  if r.takes_prefill and i in self.cluster.instances}
        loads = {i: _prompt_tokens(inst) for i, inst in takers.items()}
        queued = {i: [(r.request_id, r.num_tokens) for r in inst.engine.scheduler.waiting
                      if not r.output_token_ids and r.request_id not in inst.migrations_out]
                  for i, inst in takers.items()}
        events: list[Event] = []
        for rid, src_id, dst_id in queue_moves(loads, queued, len(takers)):
            src, dst = takers[src_id], takers[dst_id]
            run = MigrationRun(src, dst, rid, self.migration, self.cost, now, on_done=self._moved)
            events += self._launch(run, now)
        return events

    def _launch(self, run: MigrationRun, now: float) -> list[Event]:
        """A hand-off or a queue move starts: its source's llumlet and the count know first."""
        run.src.llumlet.on_migration_started(run.request_id)
        self._on_started()
        return run.start(now)

    def _moved(self, run: MigrationRun, now: float) -> list[Event]:
        committed = run.protocol.report().committed
        run.src.llumlet.on_migration_finished(run.request_id, committed)
        self.counts["queue_moves" if committed else "queue_moves_aborted"] += 1
        return self._on_finished(run, now)

    def _view(self) -> PoolView:
        fcfg = self.policy.config.freeness
        statuses = {**self.policy.gs.statuses, **self.policy.gs_decode.statuses}
        return PoolView(roles=dict(self.policy.roles), role_since=self.policy.cluster.role_since,
                        queued_tokens={i: queued_prefill_tokens(s) for i, s in statuses.items()},
                        freeness={i: freeness(s, fcfg) for i, s in statuses.items()},
                        num_waiting_handoffs=self._num_waiting())

    def _num_waiting(self) -> int:
        """Requests past their first token on prefill instances, not migrating."""
        n = 0
        for iid, role in self.policy.roles.items():
            inst = self.cluster.instances.get(iid)
            if role == Role.PREFILL and inst is not None:
                n += sum(1 for rid, r in inst.engine.requests.items() if r.status == RequestStatus.RUNNING
                         and r.output_token_ids and rid not in inst.migrations_out)
        return n

    def apply(self, change: RoleChange, now: float) -> None:
        inst = self.cluster.instances[change.instance_id]
        self.policy.set_role(inst, change.role)  # since the simulator's now
        self.last_change = now
        key = {"lend": "lends", "reclaim": "reclaims", "flip": "flips"}[change.reason]
        self.counts[key] += 1
        self.changes.append((now, change.instance_id, change.role, change.reason))

    def summary(self) -> dict[str, Any]:
        import numpy as np

        from llumnix.sim.metrics import summarize

        return {**self.counts, "mode": self.config.mode,
                "roles_at_end": {r: sum(1 for x in self.policy.roles.values() if x == r)
                                 for r in ("prefill", "decode", "mixed")},
                "handoff_downtime": summarize(np.asarray(self.handoff_downtimes))}


def _prompt_tokens(inst: SimInstance) -> int:
    """Prompt tokens not computed yet on ``inst`` (``queued_prefill_tokens`` of its
    engine), counting a queued prompt in migration at its destination."""
    n = sum(r.num_tokens for rid, r in inst.engine.requests.items()
            if not r.output_token_ids and rid not in inst.migrations_out)
    for rid, run in inst.migrations_in.items():
        r = run.src.engine.requests.get(rid)
        n += r.num_tokens if r is not None and not r.output_token_ids else 0
    return n
