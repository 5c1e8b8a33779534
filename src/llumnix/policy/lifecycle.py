"""An instance's lifecycle, one state machine for LlumSched, the gateway and the simulator:

    STARTING ──► SERVING ◄──► TERMINATING ──► RETIRED    (stopped once empty)
        │           │              │
        └───────────┴──────────────┴────────► FAILED      (died, or lost)

STARTING: asked for (scale-out, a replacement), loading its model. TERMINATING: draining
by migration (an admin drain, or scale-in, which then stops it); an undrain takes it back
to SERVING. RETIRED and FAILED are final: a late report of a gone instance changes nothing,
and its id is never reused. No I/O, no clock reads: the caller passes the time.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass


class InstanceState(enum.IntEnum):
    STARTING = 0
    SERVING = 1
    TERMINATING = 2
    RETIRED = 3
    FAILED = 4

    @property
    def is_gone(self) -> bool:
        return self >= InstanceState.RETIRED


S = InstanceState
_ALLOWED: dict[InstanceState | None, frozenset[InstanceState]] = {
    None: frozenset({S.STARTING, S.SERVING, S.TERMINATING}),  # first heard of (maybe after a restart)
    S.STARTING: frozenset({S.SERVING, S.FAILED}),
    S.SERVING: frozenset({S.TERMINATING, S.FAILED}),
    S.TERMINATING: frozenset({S.TERMINATING, S.SERVING, S.RETIRED, S.FAILED}),  # re-marked: a new reason
    S.RETIRED: frozenset(),
    S.FAILED: frozenset(),
}


def can_move(frm: InstanceState | None, to: InstanceState) -> bool:
    """Whether the machine allows ``frm`` -> ``to`` (``frm`` None: first heard of)."""
    return to in _ALLOWED[frm]


@dataclass(frozen=True)
class Entry:
    state: InstanceState
    since: float
    """When it entered ``state``."""
    reason: str = ""
    """Why (``"scale-in"`` or ``"drain"`` for TERMINATING; the failure for FAILED)."""


class Lifecycles:
    """Every instance's state. ``move`` applies a transition if the machine allows it and
    says whether it did; gone instances are remembered (the last ``keep_gone``), so their
    ids stay taken and their late reports stay ignored."""

    def __init__(self, keep_gone: int = 10_000) -> None:
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self.keep_gone = keep_gone
        self._num_gone = 0

    def get(self, instance_id: str) -> Entry | None:
        return self._entries.get(instance_id)

    def state(self, instance_id: str) -> InstanceState | None:
        e = self._entries.get(instance_id)
        return None if e is None else e.state

    def can_move(self, instance_id: str, to: InstanceState) -> bool:
        return can_move(self.state(instance_id), to)

    def move(self, instance_id: str, to: InstanceState, now: float, reason: str = "") -> bool:
        if not self.can_move(instance_id, to):
            return False
        self._entries[instance_id] = Entry(to, now, reason)
        if to.is_gone:
            self._entries.move_to_end(instance_id)
            self._num_gone += 1
            self._forget_oldest_gone()
        return True

    def restart(self, instance_id: str, now: float) -> None:
        """An explicit registration: whatever came before, the instance serves now."""
        self._num_gone -= self.is_gone(instance_id)
        self._entries[instance_id] = Entry(S.SERVING, now)

    def ids(self, *states: InstanceState) -> list[str]:
        return [iid for iid, e in self._entries.items() if e.state in states]

    def is_gone(self, instance_id: str) -> bool:
        s = self.state(instance_id)
        return s is not None and s.is_gone

    def all_ids(self) -> list[str]:
        """Every id ever seen and still remembered (new ids must differ from these)."""
        return list(self._entries)

    def _forget_oldest_gone(self) -> None:
        while self._num_gone > self.keep_gone:
            for iid, e in self._entries.items():
                if e.state.is_gone:
                    del self._entries[iid]
                    self._num_gone -= 1
                    break
