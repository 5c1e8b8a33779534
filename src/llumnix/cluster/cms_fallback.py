"""The gateway's fallback view while LlumSched is away: the shared meta store's
statuses (when the cluster has one), for dispatch and for ``/admin/cluster``."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from llumnix.core.aio import within
from llumnix.core.status import InstanceStatus

if TYPE_CHECKING:
    from llumnix.cluster.gateway_client import ClusterBackend


class CmsFallback:
    def __init__(self, backend: ClusterBackend) -> None:
        self._b = backend
        self.store: Any = None
        """The shared meta store (Redis) when the cluster has one."""
        self.staleness_s = 2.0
        """A status older than this is not dispatched on."""
        self.num_dispatches = 0

    async def _statuses(self) -> dict[str, InstanceStatus]:
        """The shared meta store's view ({} without one, or while it is unreachable)."""
        if self.store is None:
            return {}
        try:
            return await within(asyncio.to_thread(self.store.all_statuses), 2.0)
        except Exception:  # noqa: BLE001 - no view: the callers fall back further
            return {}

    async def pick(self) -> str | None:
        """Fallback dispatch from the shared view: the freest instance this gateway can
        reach whose status is fresh, schedulable and not terminating, and that takes new
        requests under PD (not a decode instance; None without a view)."""
        from llumnix.policy import FreenessConfig, freeness

        now = time.time()
        takes = self._b.gs.takes_prefill if self._b.gs is not None else (lambda iid: True)
        fresh = [s for iid, s in (await self._statuses()).items()
                 if iid in self._b.instances and not self._b.lifecycle.is_gone(iid) and s.is_schedulable
                 and not s.is_terminating and now - s.timestamp <= self.staleness_s and takes(iid)]
        if not fresh:
            return None
        cfg = FreenessConfig()
        return max(fresh, key=lambda s: (freeness(s, cfg), s.instance_id)).instance_id

    async def info(self) -> dict[str, Any]:
        from llumnix.cluster.meta_store import status_summary
        from llumnix.policy import FreenessConfig

        cfg, now = FreenessConfig(), time.time()
        statuses = await self._statuses()
        return {"source": "cms", "instances": [status_summary(s, cfg, now)
                                               for s in sorted(statuses.values(), key=lambda s: s.instance_id)]}
