"""What LlumSched's parts (the actor, ``Membership``, ``Replacement``, ``Rescheduler``)
share, all under one lock: the scheduling view and books, the instances' lifecycles and
their actor handles, and the migration rounds under way."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from llumnix.cluster.pd import PDBook
from llumnix.policy import GlobalScheduler
from llumnix.policy.lifecycle import Lifecycles


@dataclass
class SchedState:
    gs: GlobalScheduler
    """Statuses and dispatch/rescheduling policy."""
    pd: PDBook
    """PD roles, hand-off destinations and counts (``cluster/pd.py``)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    lifecycle: Lifecycles = field(default_factory=Lifecycles)
    """Every instance's state (starting, serving, terminating, retired, failed): a gone
    one's late push revives nothing, and a scale-in victim is stopped once drained."""
    handles: dict[str, Any] = field(default_factory=dict)
    """Each known instance's actor handle."""
    in_flight: dict[str, Any] = field(default_factory=dict)
    """Source instance -> the ObjectRef of its ``migrate_out`` round under way."""

    def is_terminating(self, instance_id: str) -> bool:
        status = self.gs.statuses.get(instance_id)
        return bool(status is not None and status.is_terminating)
