"""An instance's status pushes to LlumSched over Ray, throttled: what carries its actor
handle and PD role (and, until LlumSched's line to the instance's channel is up, its
statuses); and the meta store's copy of every status."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from llumnix.core.status import InstanceStatus

log = logging.getLogger(__name__)


class StatusPusher:
    PUSH_INTERVAL_S = 0.25
    HANDLE_EVERY_S = 2.0

    def __init__(self, llumsched: Any, self_handle: Any, cms: Any,
                 fed: Callable[[], bool], role: Callable[[], str | None]) -> None:
        self._llumsched = llumsched
        self._self_handle = self_handle
        self._cms = cms
        self._fed = fed
        """Whether LlumSched reads this instance's statuses on its channel (``status_feed``)."""
        self._role = role
        self._evicted: list[bytes] = []
        self._last_pushed: InstanceStatus | None = None
        self._pushed_at = self._handle_sent_at = -1e9

    def push(self, status: InstanceStatus) -> bool:
        """To the meta store, and to LlumSched at most every ``PUSH_INTERVAL_S``: it
        reschedules twice a second and dispatches only when a gateway cannot, while the
        gateways get every status on their channels; each push is a Ray call that costs
        LlumSched about a millisecond. False when the push was held back: the server then
        reports again soon (``InstanceServer``), so the last status before a quiet spell
        is never lost. A skipped push's evicted prefix keys ride on the next one; a change
        of state (drain, health) is never held back."""
        if self._cms is not None:
            self._cms.put_status(status)  # never waits on Redis (StoreWriter)
        now = time.monotonic()
        self._evicted.extend(status.evicted_prefix_keys)
        last = self._last_pushed
        changed = last is None or (last.is_terminating, last.is_schedulable) != (
            status.is_terminating, status.is_schedulable)
        if not changed and self._fed():
            # LlumSched reads the statuses on its line to our channel (``status_feed``);
            # a push now and then still carries the handle and the role
            if now - self._handle_sent_at < self.HANDLE_EVERY_S:
                return True
        elif not changed and now - self._pushed_at < self.PUSH_INTERVAL_S:
            return False
        status = dataclasses.replace(status, evicted_prefix_keys=tuple(self._evicted))
        self._evicted.clear()
        self._last_pushed, self._pushed_at = status, now
        # The handle rides along now and then, so a restarted LlumSched (which lost its
        # state) re-learns every instance from a push; deserializing it costs LlumSched
        # more than the status.
        handle = None
        if now - self._handle_sent_at >= self.HANDLE_EVERY_S:
            handle, self._handle_sent_at = self._self_handle, now
        try:  # fire and forget: the newest wins
            self._llumsched.update_status.remote(status, handle, self._role())
        except Exception:  # noqa: BLE001 - LlumSched is restarting; the next push retries
            log.debug("status push to LlumSched failed", exc_info=True)
        return True
