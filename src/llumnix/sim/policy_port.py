"""What the simulator asks of a scheduling system (dispatch, migration, scaling).

The simulator never decides anything itself: every decision goes through a
``PolicyPort``. ``policy_bridge.PolicyBridge`` implements it over the shared
``llumnix.policy`` objects (a GlobalScheduler and one Llumlet per instance), the same
ones the real cluster runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llumnix.core.clock import Clock
    from llumnix.core.status import InstanceStatus
    from llumnix.engine import EngineCore
    from llumnix.sim.instance import SimInstance


class PolicyPort(Protocol):
    enable_migration: bool
    """Run rescheduling rounds."""
    scaling_interval_s: float
    """Seconds between auto-scaling decisions; 0 disables scaling."""
    track_reactions: bool
    """Run each report through the rescheduling trigger (the simulator sets it with
    ``trigger_gap_s``: a status's marks cost about a fifth of a periodic run's time)."""

    def bind(self, clock: Clock) -> None:
        """The simulator's virtual clock, for the ``now`` every policy call takes."""

    def make_llumlet(self, instance_id: str, engine: EngineCore) -> Any: ...

    def add_instance(self, inst: SimInstance) -> None: ...

    def remove_instance(self, inst: SimInstance) -> None: ...

    def report(self, inst: SimInstance) -> bool:
        """The instance's llumlet reports its status to the global scheduler; True: the
        status triggers a rescheduling pass (``policy/trigger.py``; False without one).
        ``deliver(push(inst))``."""

    def push(self, inst: SimInstance) -> InstanceStatus:
        """The instance's llumlet's status now, on its way to the global scheduler."""

    def deliver(self, status: InstanceStatus, *, dispatch: bool = True, reschedule: bool = True) -> bool:
        """A pushed status reaches dispatch and/or the rescheduler (``report``'s True/False)."""

    def dispatch(self, request_id: str, num_prompt_tokens: int, arrival_time: float,
                 priority: int, prompt_token_ids: list[int] | None = None, slo_class: str | None = None) -> str | None:
        """The instance to send a new request to; None if none is schedulable.
        ``prompt_token_ids``: the prompt, on traces with shared prefixes (else None);
        ``slo_class``: the class the trace names (None: none)."""

    def pair_migrations(self) -> list[tuple[str, str]]:
        """One rescheduling round: (source, destination) instance pairs."""

    def on_order(self, src_id: str, dst_id: str) -> float | None:
        """A rescheduling round ordered a migration from ``src_id`` to ``dst_id``: the
        reaction time if it is the first out of a new source, else None."""

    def select_request(self, src: SimInstance, dst: SimInstance) -> str | None:
        """The source llumlet's choice of the next request to migrate, if any."""

    def on_migration_started(self, src: SimInstance, request_id: str) -> None: ...

    def on_migration_finished(self, src: SimInstance, request_id: str, committed: bool) -> None: ...

    def keep_migrating(self, src: SimInstance, dst: SimInstance) -> bool:
        """After a migration: is the source still a source (and the destination still fit)?"""

    def is_drained(self, inst: SimInstance) -> bool:
        """A terminating instance holds nothing any more and may stop."""

    def scale(self, num_active: int) -> tuple[str, str | None]:
        """("out", None), ("in", instance to drain) or ("none", None); ``num_active``
        counts instances up or starting, not terminating."""

    def on_terminating(self, inst: SimInstance) -> None: ...
