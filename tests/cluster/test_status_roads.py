"""Issue 44, one road for a status (the part done): the shared meta store is read back by
LlumSched only when it starts (a restart resumes from it); while it runs, statuses reach
its view from the instances, never from the store. No Ray, no Redis: the store's reads
are counted."""
from __future__ import annotations

import time

import pytest

from llumnix.cluster.llumsched import LlumSchedActor
from llumnix.cluster.meta_store import RedisMetaStore
from llumnix.core.status import InstanceStatus

pytest.importorskip("redis")


def test_llumsched_reads_the_store_back_only_when_it_starts(monkeypatch):
    reads: list[str] = []
    monkeypatch.setattr(RedisMetaStore, "members", lambda self: reads.append("members") or {})
    monkeypatch.setattr(RedisMetaStore, "all_statuses", lambda self: reads.append("statuses") or {})
    sched = LlumSchedActor.__ray_actor_class__(None, "redis://127.0.0.1:1", reschedule_interval_s=0.02)
    assert reads == ["members", "statuses"]  # the resume at start
    sched.register(InstanceStatus("i0", time.time(), 100, 0, 1, 16, 8), handle=object())
    time.sleep(0.3)  # fifteen periodic rounds
    assert reads == ["members", "statuses"] and sched.rescheduler.num_passes >= 5
