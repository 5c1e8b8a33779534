"""A pool of endpoints and its dispatch: LlumSched's own ``GlobalScheduler`` over the
statuses the endpoints' books (LRS) give, so lite mode dispatches with the very policy
pipeline full mode does (freeness, prefix affinity on the gateway's token index,
power-of-two, least-requests, round-robin ...).

Cheap by design: the books and the health of each endpoint add its id to the pool's
``changed`` set on every event (dispatch, streamed tokens, completion, scrape, ejection,
re-admission, drain), and a dispatch rebuilds the statuses of those endpoints only; the
scheduler keeps every other endpoint's view and dispatch key as they were. A status is
the books themselves, current whenever nothing changed, so none is ever stale (no
``fresh`` filter cut-off); only a folded-in scrape ages, and its endpoint is rebuilt when
it does. A dispatch decides exactly as one over statuses rebuilt for every endpoint
(``tests/lite/test_pool.py`` checks it against that reference).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from llumnix.lite.config import LiteConfig, PoolConfig
from llumnix.lite.endpoint import Endpoint
from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig, freeness


def scheduling_config(lite: LiteConfig) -> SchedulingConfig:
    """A pool's scheduler config. No grace for pending dispatches: a status built from
    the books lists every request in flight (dispatches included) and none that finished,
    so the first status after a dispatch accounts for it (with a grace, a request that
    finished before any status listed it counted as running for that long: sequential
    turns of one chat left their endpoint within the prefix slack). No staleness: the
    books are real-time."""
    return SchedulingConfig.from_dict({"dispatch": {"policy": lite.dispatch, "params": lite.policy_params,
                                                    "pending_grace_s": 0.0, "staleness_s": math.inf},
                                       "rescheduling": {"enabled": False}})


class Pool:
    def __init__(self, cfg: PoolConfig, lite: LiteConfig, seed: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.changed: set[str] = set()
        """Endpoints whose books or health changed since their status was last built."""
        self.endpoints = {e.name: Endpoint(e, cfg.name, lite, self.changed) for e in cfg.endpoints}
        self.changed.update(self.endpoints)
        self.scheduler = GlobalScheduler(scheduling_config(lite), seed=seed)
        self._clock = clock
        self._last_now = 0.0
        self._expiring: dict[str, float] = {}
        """Endpoints whose status folds in a scrape: when that scrape gets too old."""

    def has_healthy(self) -> bool:
        return any(e.can_serve() for e in self.endpoints.values())

    def dispatch(self, request_id: str, prompt: list[int], priority: int, exclude: set[str]) -> Endpoint | None:
        """The endpoint for a request (None when every endpoint is ejected, drained or
        excluded); its books count the request from here on."""
        now = max(self._clock(), self._last_now)  # statuses never go back in time
        self._last_now = now
        if exclude:
            exclude = exclude & self.endpoints.keys()
            self.changed.update(exclude)  # unschedulable for this dispatch only
        if self._expiring:
            self.changed.update(i for i, t in self._expiring.items() if now >= t)
        if self.changed:
            self._refresh(now, exclude)
        picked = self.scheduler.dispatch(DispatchRequest(request_id, len(prompt), priority, now, prompt), now)
        if exclude:
            self.changed.update(exclude)  # schedulable again at the next dispatch
        if picked is None:
            return None
        ep = self.endpoints[picked]
        ep.lrs.on_dispatch(request_id, len(prompt), priority, now)
        return ep

    def _refresh(self, now: float, exclude: set[str]) -> None:
        sched, endpoints = self.scheduler, self.endpoints
        for iid in self.changed:
            ep = endpoints[iid]
            lrs = ep.lrs
            sched.update_status(lrs.status(now, ep.can_serve() and iid not in exclude))
            until = math.inf if lrs.load is None else lrs.valid_until(now)
            if until < math.inf:
                self._expiring[iid] = until
            elif self._expiring:
                self._expiring.pop(iid, None)
        self.changed.clear()

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
