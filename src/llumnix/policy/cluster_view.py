"""One owner for what the control plane knows of each instance: its lifecycle, its PD
role, its latest status, the requests dispatched to it that no report shows yet, and
the blocks promised to it by PD hand-offs since its last report.

``GlobalScheduler`` (dispatch, rescheduling, scaling), ``PDBook`` (LlumSched's PD),
LlumSched's actor and the gateway's cluster client all read and write one
``ClusterView``; the simulator's policy bridge drives the same class. Everyone else
keeps connections and handles keyed by instance, never a record of its state (a test
scans the cluster and policy packages for that). Pure: no I/O, no clock reads.

    register ─► lifecycle SERVING, role (PD's rule)      statuses[iid] = latest report
    report   ─► statuses, pending forgotten, promised dropped (GlobalScheduler.update_status)
    remove   ─► status, pending, promised and role dropped; late reports ignored until
                the instance is added again
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, MutableMapping

from llumnix.core.status import InstanceStatus
from llumnix.policy.lifecycle import InstanceState, Lifecycles
from llumnix.policy.pending import PendingDispatches


class Role(enum.StrEnum):
    """An instance's PD role (``policy/pd.py``). A ``StrEnum``: it compares equal to its
    name, so configs, JSON and ``/admin/cluster`` keep the plain strings."""

    PREFILL = "prefill"
    """Hands every request off after its first token."""
    DECODE = "decode"
    """Takes no new request; decodes what hand-offs bring."""
    MIXED = "mixed"
    """Prefills and decodes (co-located; every instance's role with PD off)."""

    @property
    def takes_prefill(self) -> bool:
        """New requests are dispatched to it."""
        return self is not Role.DECODE

    @property
    def in_decode_pool(self) -> bool:
        """A hand-off destination or rescheduled among the decode pool."""
        return self is not Role.PREFILL


class ClusterView:
    def __init__(self, statuses: MutableMapping[str, InstanceStatus] | None = None,
                 keep_gone: int = 10_000) -> None:
        self.lifecycle = Lifecycles(keep_gone)
        """Each instance's state machine (``policy/lifecycle.py``)."""
        self.statuses: MutableMapping[str, InstanceStatus] = {} if statuses is None else statuses
        """The latest status per instance (a dict, or any mapping the caller provides)."""
        self.pending = PendingDispatches()
        """Requests dispatched to each instance that no report of it shows yet."""
        self.promised: dict[str, int] = {}
        """PD: blocks promised to each decode instance by hand-offs since its last report."""
        self._roles: dict[str, Role] = {}
        self._role_since: dict[str, float] = {}
        self._num_split = 0
        """Instances whose role is not MIXED (PD is splitting the cluster when > 0)."""
        self._removed: set[str] = set()
        """Removed instances: their late reports add nothing until they are added again."""

    # -- roles -------------------------------------------------------------------------
    @property
    def roles(self) -> Mapping[str, Role]:
        """Every role given (read-only; ``set_role`` changes one)."""
        return self._roles

    @property
    def role_since(self) -> Mapping[str, float]:
        return self._role_since

    @property
    def is_split(self) -> bool:
        """Some instance is not MIXED: dispatch and rescheduling see one pool each."""
        return self._num_split > 0

    def role_of(self, instance_id: str) -> Role:
        return self._roles.get(instance_id, Role.MIXED)

    def set_role(self, instance_id: str, role: str, now: float = 0.0) -> bool:
        """Give ``instance_id`` ``role`` (since ``now``); False if it already had it."""
        new, old = Role(role), self._roles.get(instance_id)
        if old == new:
            return False
        self._num_split += (new is not Role.MIXED) - (old is not None and old is not Role.MIXED)
        self._roles[instance_id] = new
        self._role_since[instance_id] = now
        return True

    def drop_role(self, instance_id: str) -> None:
        old = self._roles.pop(instance_id, None)
        self._role_since.pop(instance_id, None)
        self._num_split -= old is not None and old is not Role.MIXED

    def takes_prefill(self, instance_id: str) -> bool:
        return self.role_of(instance_id).takes_prefill

    def in_decode_pool(self, instance_id: str) -> bool:
        return self.role_of(instance_id).in_decode_pool

    def ids_with(self, *roles: Role) -> list[str]:
        return sorted(i for i, r in self._roles.items() if r in roles)

    # -- membership ----------------------------------------------------------------------
    def admit(self, instance_id: str, now: float) -> None:
        """An instance added: it serves, unless it is known and draining (a restarted
        LlumSched relearns a drain); one added again after its removal starts afresh."""
        state = self.lifecycle.state(instance_id)
        if (instance_id in self._removed or state is None or state == InstanceState.STARTING
                or state.is_gone):
            self.lifecycle.restart(instance_id, now)
        self._removed.discard(instance_id)

    def is_removed(self, instance_id: str) -> bool:
        return instance_id in self._removed

    def forget(self, instance_id: str) -> None:
        """A removed instance: its status, pending dispatches, promises and role go; its
        lifecycle entry stays (the caller moves it to RETIRED or FAILED)."""
        self.statuses.pop(instance_id, None)
        self.pending.remove_instance(instance_id)
        self.promised.pop(instance_id, None)
        self.drop_role(instance_id)
        self._removed.add(instance_id)

    def is_marked_terminating(self, instance_id: str) -> bool:
        """Draining (an admin drain or scale-in), whatever its last report says."""
        return self.lifecycle.state(instance_id) == InstanceState.TERMINATING

    def mark_terminating(self, instance_id: str, now: float) -> None:
        if not self.is_marked_terminating(instance_id):
            self.lifecycle.move(instance_id, InstanceState.TERMINATING, now)

    def unmark_terminating(self, instance_id: str, now: float) -> None:
        if self.is_marked_terminating(instance_id):
            self.lifecycle.move(instance_id, InstanceState.SERVING, now)
