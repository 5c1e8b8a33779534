"""What LlumSched's parts (the actor, ``Membership``, ``Replacement``, ``Rescheduler``)
share, all under one lock: the scheduler and the PD book over one ``ClusterView``, the
instances' actor handles, and the migration rounds under way."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from llumnix.cluster.pd import PDBook
from llumnix.policy import GlobalScheduler
from llumnix.policy.cluster_view import ClusterView
from llumnix.policy.lifecycle import Lifecycles


@dataclass
class SchedState:
    gs: GlobalScheduler
    """Statuses and dispatch/rescheduling policy."""
    pd: PDBook
    """PD roles, hand-off destinations and counts (``cluster/pd.py``)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    handles: dict[str, Any] = field(default_factory=dict)
    """Each known instance's actor handle."""
    in_flight: dict[str, Any] = field(default_factory=dict)
    """Source instance -> the ObjectRef of its ``migrate_out`` round under way."""

    @property
    def cluster(self) -> ClusterView:
        """The one record of each instance (lifecycle, role, status, pending), which the
        scheduler and the PD book share."""
        return self.gs.cluster

    @property
    def lifecycle(self) -> Lifecycles:
        """Every instance's state (starting, serving, terminating, retired, failed): a gone
        one's late announcement revives nothing, and a scale-in victim is stopped once drained."""
        return self.gs.cluster.lifecycle

    def is_terminating(self, instance_id: str) -> bool:
        status = self.gs.statuses.get(instance_id)
        return bool(status is not None and status.is_terminating)
