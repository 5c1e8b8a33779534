"""LlumSched's side of a shared meta store (Redis): at start, the members and statuses a
restarted LlumSched resumes from, and the removal of a gone instance's records. The store
is read back only then (issue 44, one road for a status): while LlumSched runs, statuses
reach its view on the instances' channels (``status_feed``), never from the store. In
memory (no shared store) there is nothing to mirror."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray

from llumnix.cluster.llumsched_state import SchedState
from llumnix.cluster.meta_store import RedisMetaStore, StoreWriter, make_meta_store
from llumnix.core.status import InstanceStatus

log = logging.getLogger(__name__)


class CmsMirror:
    def __init__(self, url: str | None, state: SchedState) -> None:
        self.url = url
        store = make_meta_store(url)
        # In memory the scheduler's own statuses are the store: nothing to copy. A shared
        # store is written off the lock (a hung Redis must not stall dispatch); the
        # instances write their own statuses to it.
        self._cms: RedisMetaStore | None = store if isinstance(store, RedisMetaStore) else None
        self._writer: StoreWriter | None = None if self._cms is None else StoreWriter(self._cms)
        self._state = state

    def resume(self, relearn: Callable[[str, InstanceStatus, Any], None]) -> int:
        """A (re)started LlumSched over a shared store takes its members and their latest
        statuses from it (``relearn`` each, under the lock): it schedules at once, without
        waiting for every instance's next announcement. Members whose actor is gone are dropped."""
        if self._cms is None or self._writer is None:
            return 0
        try:
            members, statuses = self._cms.members(), self._cms.all_statuses()
        except Exception as e:  # noqa: BLE001 - unreachable: relearn from the announcements instead
            log.warning("meta store %s unreachable at start (%s); instances are learnt from their announcements",
                        self._cms.url, type(e).__name__)
            return 0
        found = 0
        for iid, record in members.items():
            status = statuses.get(iid)
            if status is None:
                continue
            try:
                handle = ray.get_actor(record["actor_name"])
            except Exception:  # noqa: BLE001 - its actor is gone: a dead member
                self._writer.remove_member(iid)
                continue
            with self._state.lock:
                relearn(iid, status, handle)
            found += 1
        if found:
            log.warning("resumed %d instance(s) from the meta store %s", found, self._cms.url)
        return found

    def remove(self, instance_id: str) -> None:
        """A gone instance's status and membership records (written off the lock)."""
        if self._writer is not None:
            self._writer.remove(instance_id)
            self._writer.remove_member(instance_id)
