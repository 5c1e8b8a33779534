"""Auto-scaling in the simulator: at each SCALING event the policy's decision (``policy/scaling.py``
through the bridge), a new instance up after its start-up delay, a scale-in victim marked
terminating and retired once drained. The ``Simulator`` owns one, as it owns a ``PDFlow``;
LlumSched's ``Replacement`` is the cluster's side."""
from __future__ import annotations

from collections.abc import Callable

from llumnix.policy.lifecycle import InstanceState
from llumnix.sim.cluster import Cluster, ClusterConfig
from llumnix.sim.events import Event, EventKind
from llumnix.sim.instance import SimInstance
from llumnix.sim.metrics import MetricsCollector
from llumnix.sim.policy_port import PolicyPort

_INF = float("inf")


class ScalingFlow:
    def __init__(self, config: ClusterConfig, cluster: Cluster, policy: PolicyPort, metrics: MetricsCollector,
                 *, report: Callable[[SimInstance], None], retire: Callable[[SimInstance], list[Event]],
                 drain_gateway: Callable[[], list[Event]], is_done: Callable[[], bool]) -> None:
        self.config, self.cluster, self.policy, self.metrics = config, cluster, policy, metrics
        self._report, self._retire, self._drain_gateway, self._is_done = report, retire, drain_gateway, is_done
        self.interval_s = policy.scaling_interval_s
        self._n = 1
        self.next_at = _INF
        """When the next SCALING event comes (inf: scaling off)."""

    def start(self) -> list[Event]:
        if not self.interval_s:
            return []
        self.next_at = self.interval_s
        return [Event(self.next_at, EventKind.SCALING)]

    def on_scaling(self, now: float) -> list[Event]:
        if self._is_done():
            return []
        self._n += 1
        self.next_at = self._n * self.interval_s
        events = [Event(self.next_at, EventKind.SCALING)]
        active = sum(1 for i in self.cluster.instances.values() if not i.is_terminating)
        kind, victim = self.policy.scale(active)
        if kind == "out":
            inst = self.cluster.new_instance(up=False)
            events.append(Event(now + self.config.instance_startup_s, EventKind.INSTANCE_UP, inst))
            self.metrics.on_instances(now, self.cluster.num_live)
        elif kind == "in" and victim in self.cluster.instances:
            inst = self.cluster.instances[victim]
            inst.move(InstanceState.TERMINATING)
            self.policy.on_terminating(inst)
            self._report(inst)
            if self.policy.is_drained(inst):
                events += self._retire(inst)
        return events

    def on_instance_up(self, inst: SimInstance, now: float) -> list[Event]:
        inst.move(InstanceState.SERVING)
        inst.up_since = now
        self.policy.add_instance(inst)
        self._report(inst)
        return self._drain_gateway()
