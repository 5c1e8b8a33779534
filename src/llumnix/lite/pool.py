"""A pool of endpoints and its dispatch: LlumSched's own ``GlobalScheduler`` over the
statuses the endpoints' books (LRS) give, so lite mode dispatches with the very policy
pipeline full mode does (freeness, prefix affinity on the gateway's token index,
power-of-two, least-requests, round-robin ...).

A status is rebuilt only for an endpoint whose books changed since the last dispatch,
and only when a dispatch needs it: streamed tokens cost a counter update, not a status.
"""
from __future__ import annotations

import time
from typing import Any

from llumnix.lite.config import LiteConfig, PoolConfig
from llumnix.lite.endpoint import Endpoint
from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig, freeness


class Pool:
    def __init__(self, cfg: PoolConfig, lite: LiteConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.endpoints = {e.name: Endpoint(e, cfg.name, lite) for e in cfg.endpoints}
        # No grace for pending dispatches: a status built from the books lists every request
        # in flight (dispatches included) and none that finished, so the first status after
        # a dispatch accounts for it. With a grace, a request that finished before any status
        # listed it counted as running for that long (sequential turns of one chat left
        # their endpoint within the prefix slack).
        sched = SchedulingConfig.from_dict({"dispatch": {"policy": lite.dispatch, "params": lite.policy_params,
                                                         "pending_grace_s": 0.0},
                                            "rescheduling": {"enabled": False}})
        self.scheduler = GlobalScheduler(sched, seed=seed)
        self._dirty: set[str] = set(self.endpoints)
        self._last_now = 0.0

    def touch(self, endpoint_id: str) -> None:
        """The endpoint's books changed: rebuild its status before the next dispatch."""
        self._dirty.add(endpoint_id)

    def has_healthy(self) -> bool:
        return any(e.can_serve() for e in self.endpoints.values())

    def _refresh(self, now: float) -> None:
        sched = self.scheduler
        for iid in self._dirty:
            ep = self.endpoints[iid]
            sched.update_status(ep.lrs.status(now, ep.can_serve()))
        self._dirty.clear()

    def dispatch(self, request_id: str, prompt: list[int], priority: int, exclude: set[str]) -> Endpoint | None:
        """The endpoint for a request (None when every endpoint is ejected, drained or
        excluded); its books count the request from here on."""
        now = max(time.time(), self._last_now)  # statuses never go back in time
        self._last_now = now
        exclude = exclude & self.endpoints.keys()
        self._dirty.update(i for i, e in self.endpoints.items()
                           if e.can_serve() != self._schedulable(i) or i in exclude)
        self._refresh(now)
        sched = self.scheduler
        for iid in exclude:
            sched.set_schedulable(iid, False)
        picked = sched.dispatch(DispatchRequest(request_id, len(prompt), priority, now, prompt), now)
        self._dirty.update(exclude)  # restored at the next dispatch
        if picked is None:
            return None
        ep = self.endpoints[picked]
        ep.lrs.on_dispatch(request_id, len(prompt), priority, now)
        self._dirty.add(picked)
        return ep

    def _schedulable(self, iid: str) -> bool:
        s = self.scheduler.statuses.get(iid)
        return s is not None and s.is_schedulable

    def summaries(self) -> list[dict[str, Any]]:
        """Per endpoint: its status as dispatch sees it, its health and its books."""
        now = time.time()
        out = []
        for iid, ep in sorted(self.endpoints.items()):
            s = ep.lrs.status(now, ep.can_serve())
            out.append({"instance_id": iid, "freeness": freeness(s, self.scheduler.config.freeness),
                        "num_running": s.num_running, "num_waiting": s.num_waiting,
                        "num_used_blocks": s.num_used_blocks, "num_total_blocks": s.num_total_blocks,
                        "block_size": s.block_size,
                        "is_schedulable": s.is_schedulable, **ep.summary(now)})
        return out
