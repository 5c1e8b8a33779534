"""LlumSched's members as gateways see them (each instance's handle, terminating flag
and PD role) and the long-polling watch that tells a gateway when they change."""
from __future__ import annotations

import threading
import time
from typing import Any

from llumnix.cluster.llumsched_state import SchedState


class Membership:
    def __init__(self, state: SchedState) -> None:
        self._state = state
        self._cv = threading.Condition(state.lock)
        self._key: tuple[tuple[str, bool, str], ...] = ()
        self.version = (time.time_ns(), 0)
        """Changes with the members, their terminating flags and roles (its first part
        differs between restarts): what a gateway's ``watch`` waits on."""

    def members(self, skip: set[str]) -> dict[str, dict[str, Any]]:
        """Every live instance (caller holds the lock), with its handle unless in ``skip``."""
        st = self._state
        return {iid: {"handle": None if iid in skip else h, "is_terminating": st.is_terminating(iid),
                      "role": st.pd.role_of(iid)} for iid, h in st.handles.items()}

    def watch(self, known: list[str], seen: tuple[int, int] | None,
              timeout_s: float) -> tuple[tuple[int, int], dict[str, dict[str, Any]]]:
        """The members once they differ from version ``seen``, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self.version == seen and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)
            return self.version, self.members(set(known))

    def note(self) -> None:
        """Wake the watches if the members, a terminating flag or a role changed since the
        last note (caller holds the lock). Called where members come and go, and by every
        periodic round (flags and roles arrive with statuses and PD rounds)."""
        st = self._state
        key = tuple(sorted((iid, st.is_terminating(iid), st.pd.role_of(iid)) for iid in st.handles))
        if key != self._key:
            self._key = key
            self.version = (self.version[0], self.version[1] + 1)
            self._cv.notify_all()
