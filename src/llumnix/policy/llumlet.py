"""Llumlet: the per-instance agent's logic, beside one engine (no I/O, no clock)."""
from __future__ import annotations

import dataclasses
from typing import Protocol

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, ReschedulingConfig
from llumnix.policy.freeness import freeness
from llumnix.policy.selection import select_requests


class EngineLike(Protocol):
    def get_status(self) -> InstanceStatus: ...


class Llumlet:
    def __init__(self, instance_id: str, engine: EngineLike, rescheduling: ReschedulingConfig,
                 freeness_cfg: FreenessConfig) -> None:
        self.instance_id = instance_id
        self.engine = engine
        self.rescheduling = rescheduling
        self.freeness_cfg = freeness_cfg
        self.is_terminating = False
        self.is_schedulable = True
        self.migrating_out: set[str] = set()

    def report(self, now: float) -> InstanceStatus:
        """The engine's snapshot plus what only the llumlet knows."""
        s = self.engine.get_status()
        running = tuple(dataclasses.replace(r, is_migrating=True) if r.request_id in self.migrating_out
                        else r for r in s.running)
        return dataclasses.replace(s, instance_id=self.instance_id, timestamp=now, running=running,
                                   is_terminating=self.is_terminating, is_schedulable=self.is_schedulable,
                                   num_migrating_out=len(self.migrating_out))

    def freeness(self, now: float) -> float:
        return freeness(self.report(now), self.freeness_cfg)

    def select_requests_to_migrate(self, now: float, max_n: int = 1) -> list[str]:
        return select_requests(self.report(now), self.rescheduling.selection, max_n,
                               exclude=self.migrating_out)

    def should_keep_migrating(self, now: float) -> bool:
        """The paper: a source keeps migrating until it is no longer a source."""
        s = self.report(now)
        if self.is_terminating:
            return bool(s.running or s.waiting)
        return freeness(s, self.freeness_cfg) < self.rescheduling.out_threshold

    def on_migration_started(self, request_id: str) -> None:
        self.migrating_out.add(request_id)

    def on_migration_finished(self, request_id: str, committed: bool) -> None:
        self.migrating_out.discard(request_id)
