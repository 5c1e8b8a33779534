"""An instance's side of the one road a status travels (issue 44). Each status the
engine reports goes to the request channel's readers (gateways and LlumSched's feed,
``status_feed``) and, here, to the meta store; LlumSched hears from the instance over Ray
only its announcement: its actor handle and PD role, at start and every
``ANNOUNCE_EVERY_S`` (at once when the role changes). A restarted LlumSched relearns
every instance from the next announcement, and the statuses from its line to the
instance's channel from then on."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from llumnix.core.status import InstanceStatus

log = logging.getLogger(__name__)


class Announcer:
    ANNOUNCE_EVERY_S = 2.0

    def __init__(self, llumsched: Any, self_handle: Any, cms: Any, role: Callable[[], str | None]) -> None:
        self._llumsched = llumsched
        self._self_handle = self_handle
        self._cms = cms
        self._role = role
        self._announced_at = -1e9
        self._announced_role: str | None = None

    def on_status(self, status: InstanceStatus) -> None:
        """Called on the step thread with every status the engine reports: written to the
        meta store (never waits on Redis: ``StoreWriter``), and the announcement sent when
        one is due. The status itself never rides a Ray call."""
        if self._cms is not None:
            self._cms.put_status(status)
        now, role = time.monotonic(), self._role()
        if now - self._announced_at < self.ANNOUNCE_EVERY_S and role == self._announced_role:
            return
        self._announced_at, self._announced_role = now, role
        try:  # fire and forget: the next one comes in two seconds
            self._llumsched.announce.remote(status.instance_id, self._self_handle, role)
        except Exception:  # noqa: BLE001 - LlumSched is restarting
            log.debug("announcement to LlumSched failed", exc_info=True)
