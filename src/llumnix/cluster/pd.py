"""Prefill-decode disaggregation on the Ray cluster: LlumSched's book of roles and
hand-offs (here), and the prefill instance's hand-off worker (``cluster/handoff.py``).
The decisions are
``policy/pd.py``'s pure functions, as in the simulator (``sim/pd_flow.py``)::

    prefill instance: a step's output carries a request's first token, or a step ran a
        prompt's chunk (the step thread's hook) ─► HandoffWorker (cluster/handoff.py) wakes
        ─► those requests (running, no hand-off yet), first-token ones first ─► for
        each: LlumSched.pd_destination (PDBook.pick: pick_decode_instance over its
        statuses, less the blocks promised since each one's last report)
          ─► a decode instance: the live migration (migrate()) on a thread of its own,
               up to ``max_in_flight`` side by side (a followed prompt's lasts its
               chunks; no request waits behind it, decoding beside them); a prompt still
               prefilling is followed: the destination reserves its whole table at once,
               each finished chunk's full blocks are copied while the next computes, and,
               with prompt work waiting here, it is paused at the boundary right after its
               first token, so the last stage copies only the tail (without, the tail is
               pre-copied while it decodes) ─► LlumSched.pd_handoff_done (counted)
          ─► None (the decode pool is full): it keeps decoding here; offered again
               every ``retry_s`` until a decode instance has room (never dropped)
    LlumSched's round (adaptive): adaptive_decisions ─► PDBook.apply ─► the instance's
        set_role; gateways learn the new role with their next membership refresh

The gateway's and LlumSched's ``GlobalScheduler`` both take the roles
(``set_role``): dispatch only to prefill-taking instances, rescheduling only
within the decode pool.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from llumnix.core.status import InstanceStatus
from llumnix.policy.cluster_view import ClusterView, Role
from llumnix.policy.config import FreenessConfig
from llumnix.policy.freeness import freeness
from llumnix.policy.pd import (
    PDConfig,
    PoolView,
    RoleChange,
    adaptive_decisions,
    handoff_blocks,
    pick_decode_instance,
    queued_prefill_tokens,
)

log = logging.getLogger(__name__)
_CHANGE_COUNTS = {"lend": "lends", "reclaim": "reclaims", "flip": "flips"}


class PDBook:
    """LlumSched's PD: the role rule at registration, hand-off destinations, adaptive
    rounds, the counts. Each instance's role and since when, and the blocks promised to
    each decode instance by hand-offs started since its last report, live in the
    ``ClusterView`` the book shares with the scheduler. Plain object; the actor calls it
    under its lock."""

    def __init__(self, config: PDConfig, fcfg: FreenessConfig, cluster: ClusterView | None = None) -> None:
        self.config = config
        self.fcfg = fcfg
        self.cluster = ClusterView() if cluster is None else cluster
        self.last_change: float | None = None
        self.counts = {"handoffs_done": 0, "handoffs_failed": 0, "handoffs_ended_first": 0, "handoffs_waiting": 0,
                       "lends": 0, "reclaims": 0, "flips": 0, "role_resends": 0}
        self.changes: deque[dict[str, Any]] = deque(maxlen=100)
        self.downtimes_s: deque[float] = deque(maxlen=1000)
        """Each committed hand-off's stall: the request's pause on the prefill instance
        to its first step on the decode instance (the migration's downtime)."""
        self.abort_reasons: dict[str, int] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=200)
        """The latest committed hand-offs' reports (blocks, bytes, stages, times)."""

    @property
    def roles(self) -> Mapping[str, Role]:
        return self.cluster.roles

    def role_of(self, instance_id: str) -> Role:
        return self.cluster.role_of(instance_id)

    def add(self, instance_id: str, now: float, role: str | None = None) -> Role:
        """A registering instance's role: the one it reports (after a restart of LlumSched),
        else prefill while fewer than ``prefill_instances`` are, else decode (mixed with PD off)."""
        known = self.cluster.roles.get(instance_id)
        if role is None:
            role = known
        if role is None:
            num_prefill = len(self.cluster.ids_with(Role.PREFILL))
            role = (Role.MIXED if not self.config.is_on else
                    Role.PREFILL if num_prefill < self.config.prefill_instances else Role.DECODE)
        self.cluster.set_role(instance_id, role, now)
        return Role(role)

    def remove(self, instance_id: str) -> None:
        self.cluster.drop_role(instance_id)
        self.cluster.promised.pop(instance_id, None)

    def on_status(self, instance_id: str) -> None:
        """A report counts every reservation made before it."""
        self.cluster.promised.pop(instance_id, None)

    def reconcile(self, instance_id: str, reported: str | None, now: float, grace_s: float = 1.0) -> str | None:
        """The role to tell an instance again whose announcement reports another than this book's
        (its ``set_role`` was lost or timed out), or None. An announcement sent before a change it
        has not heard yet reports the old role: changes younger than ``grace_s`` are let be."""
        role = self.cluster.roles.get(instance_id)
        if not self.config.is_on or reported is None or role is None:
            return None
        if reported == role or now - self.cluster.role_since.get(instance_id, now) < grace_s:
            return None
        self.counts["role_resends"] += 1
        return role

    # -- hand-offs -----------------------------------------------------------------
    def pick(self, statuses: Iterable[InstanceStatus], src_id: str, num_blocks: int) -> str | None:
        """The decode instance for a hand-off of ``num_blocks`` from ``src_id`` (None: the
        decode pool is full, counted as waiting); its blocks are promised until it reports."""
        fcfg, promised = self.fcfg, self.cluster.promised
        dst = pick_decode_instance(list(statuses), self.cluster.roles, num_blocks, self.config,
                                   lambda s: freeness(s, fcfg), promised, exclude=src_id)
        if dst is None:
            self.counts["handoffs_waiting"] += 1
            return None
        promised[dst] = promised.get(dst, 0) + handoff_blocks(num_blocks, self.config)
        return dst

    def on_handoff(self, report: dict[str, Any]) -> None:
        if report.get("committed"):
            self.counts["handoffs_done"] += 1
            if report.get("downtime") is not None:
                self.downtimes_s.append(float(report["downtime"]))
            self.recent.append({**report, "reported_at": time.time()})  # its times: the source's monotonic clock
            return
        code = str(report.get("abort_code") or report.get("abort_reason") or "other").split(":")[0][:60]
        self.abort_reasons[code] = self.abort_reasons.get(code, 0) + 1
        # a request that ended before its hand-off did (short outputs) needs none: not a failure
        self.counts["handoffs_ended_first" if code == "source_finished" else "handoffs_failed"] += 1

    # -- adaptive PD ----------------------------------------------------------------
    def decide_all(self, statuses: dict[str, InstanceStatus], now: float) -> list[RoleChange]:
        """Adaptive PD's changes this round: up to ``max_lends_per_round`` lends, else at
        most one reclaim or flip (none with static roles)."""
        if self.config.mode != "adaptive":
            return []
        roles = self.cluster.roles
        known = {i: s for i, s in statuses.items() if i in roles}
        waiting = sum(1 for i, s in known.items() if roles[i] == Role.PREFILL
                      for r in s.running if r.num_output_tokens > 0 and not r.is_migrating)
        view = PoolView(roles=dict(roles), role_since=self.cluster.role_since,
                        queued_tokens={i: queued_prefill_tokens(s) for i, s in known.items()},
                        freeness={i: freeness(s, self.fcfg) for i, s in known.items()},
                        num_waiting_handoffs=waiting)
        return adaptive_decisions(view, self.config, now, self.last_change)

    def apply(self, change: RoleChange, now: float) -> None:
        self.cluster.set_role(change.instance_id, change.role, now)
        self.last_change = now
        self.counts[_CHANGE_COUNTS[change.reason]] += 1
        self.changes.append({"time": now, "instance_id": change.instance_id, "role": change.role,
                             "reason": change.reason})

    def info(self) -> dict[str, Any]:
        """PD's part of ``/admin/cluster``."""
        d = sorted(self.downtimes_s)
        return {"mode": self.config.mode, "roles": dict(sorted(self.roles.items())), **self.counts,
                "handoff_abort_reasons": dict(self.abort_reasons),
                "handoff_downtime_s": {"count": len(d), "p50": d[len(d) // 2] if d else None,
                                       "p99": d[min(len(d) - 1, int(0.99 * len(d)))] if d else None},
                "role_changes": list(self.changes)[-20:], "handoffs_recent": list(self.recent)}
