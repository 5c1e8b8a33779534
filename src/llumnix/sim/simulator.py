"""The cluster simulator: the real engines, llumlets and global scheduler in virtual time.

Event flow (each handler returns the events it causes)::

    ARRIVAL ──dispatch──► engine.add_request ──► wake ──► STEP_END ──► STEP_END ...
       │ (nothing schedulable: gateway queue, retried every status round)
    STATUS_REPORT every status_interval_s: llumlets report to the global scheduler
    RESCHEDULE every reschedule_every rounds: pairs -> MigrationRun -> MIGRATION_STAGE ...
       a source keeps migrating (one request at a time) while it is still a source
    RESCHEDULE (a pass), with ``trigger_gap_s``: a report whose marks trigger one
       (``policy/trigger.py``, as LlumSched) -> at once, or when the gap since the last ends
    with ``status_delay_s``: a report reaches dispatch at once and the rescheduler (its own
       GlobalScheduler, as LlumSched is apart from the gateway) as a STATUS_REPORT that long
       after; with ``migration_start_s``: an order reaches its source as a MIGRATION_STAGE
       that long after the pass, which picks the request and starts then
    SCALING / INSTANCE_UP: decisions of the scheduler, start-up delay

A status report nobody reads is not built: between two rounds only a dispatch, a
rescheduling round or a scaling decision reads statuses, and their times are known
in advance (arrivals come from the trace), so a report is skipped exactly when the
next one would overwrite it unread.
"""
from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from llumnix.core.errors import RequestTooLongError
from llumnix.core.request import Priority
from llumnix.core.sampling_params import SamplingParams
from llumnix.policy.lifecycle import InstanceState
from llumnix.policy.rounds import pairs_to_start
from llumnix.policy.slo import SLOConfig
from llumnix.policy.slo_dispatch import RequestShedError
from llumnix.policy.trigger import PassTimer
from llumnix.sim.cluster import Cluster, ClusterConfig
from llumnix.sim.events import Event, EventKind
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import LatencyModel
from llumnix.sim.loop import EventLoop
from llumnix.sim.metrics import MetricsCollector
from llumnix.sim.migration import MigrationRun, OrderInFlight
from llumnix.sim.pd_flow import PDFlow
from llumnix.sim.policy_bridge import PolicyBridge
from llumnix.sim.policy_port import PolicyPort
from llumnix.sim.scaling_flow import ScalingFlow
from llumnix.sim.workloads import Trace, TraceError

_INF = float("inf")
_PASS = "pass"
"""A RESCHEDULE event's target when a trigger asked for it (a periodic round's is None)."""


def named_classes(trace: Trace, policy: PolicyPort) -> tuple[Trace, list[str] | None]:
    """The trace with each request that names an SLO class at that class's priority (as the
    gateway runs a request that names ``slo_class``), and each request's class name (None:
    the trace names none). A class the system's ``scheduling.slo`` lacks is a one-line error."""
    if not trace.slo_class_names or trace.slo_class_ids is None:
        return trace, None
    slo = policy.config.slo if isinstance(policy, PolicyBridge) else SLOConfig()
    for name in trace.slo_class_names:
        if name not in slo.classes:
            raise TraceError(f"trace {trace.name!r} names slo class {name!r}, which scheduling.slo does not "
                             f"define (known: {', '.join(slo.classes)})")
    ids = trace.slo_class_ids
    priorities = np.array([slo.get(n).priority for n in trace.slo_class_names], np.int64)[ids]
    return dataclasses.replace(trace, priorities=priorities), [trace.slo_class_names[k] for k in ids.tolist()]


class Simulator:
    def __init__(self, config: ClusterConfig, latency: LatencyModel, policy: PolicyPort, trace: Trace,
                 *, progress: Callable[[int], None] | None = None, priorities: bool = True) -> None:
        self.config = config
        self.priorities = priorities
        """False: every request is sent as normal priority (metrics keep the trace's class)."""
        self.latency = latency
        self.policy = policy
        self.trace, self._slo_names = named_classes(trace, policy)
        self.progress = progress
        self.loop = EventLoop()
        self.clock = self.loop.clock
        self.metrics = MetricsCollector()
        policy.bind(self.clock)
        self.cluster = Cluster(config, latency, self.clock, make_llumlet=policy.make_llumlet)
        self.pd: PDFlow | None = None
        """Prefill-decode disaggregation (the policy's ``pd`` on): hand-offs, role changes."""
        if isinstance(policy, PolicyBridge) and policy.config.pd.is_on:
            self.pd = PDFlow(policy, self.cluster, config.migration, latency.migration,
                             self._on_handoff_started, self._on_handoff_done)
        self.scaling = ScalingFlow(config, self.cluster, policy, self.metrics, report=self._report, retire=self._retire,
                                   drain_gateway=self._drain_gateway, is_done=lambda: self.is_done)
        """Auto-scaling: the policy's decisions, instances started and retired."""
        self.gateway: list[tuple[int, float, int]] = []
        """Requests no instance could take yet: a heap in dispatch order (higher priority
        first, FCFS within a priority) of (-priority, arrival time, trace index)."""
        self.num_done = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        """The loop's CPU time: on a shared machine a steadier measure of its speed than wall time."""
        self._round = 0
        self._resched_n = 1
        self._next_arrival = _INF
        self._next_reschedule = _INF
        self._num_migrating = 0
        self._starting: set[str] = set()
        """Sources whose migration order is on its way (``migration_start_s``)."""
        self._next_round = 0.0
        gap = config.trigger_gap_s if policy.enable_migration else None
        self._timer = None if gap is None else PassTimer(config.status_interval_s * config.reschedule_every, gap)
        policy.track_reactions = self._timer is not None
        """Triggered passes, as LlumSched's (None: periodic rounds only)."""
        self._pass_at: float | None = None
        """When the pending triggered pass runs (None: none pending)."""
        self.num_rounds = 0
        self.num_passes = 0
        self.num_triggers = 0
        self.reaction_s: list[float] = []
        """Per new source, from the status that made it one to its first migration order."""
        loop = self.loop
        loop.on(EventKind.ARRIVAL, self.on_arrival)
        loop.on(EventKind.STEP_END, self.on_step_end)
        loop.on(EventKind.STATUS_REPORT, self.on_status_round)
        loop.on(EventKind.RESCHEDULE, self.on_reschedule)
        loop.on(EventKind.MIGRATION_STAGE, lambda ev: ev.target.on_stage_done(self.clock.now()))
        loop.on(EventKind.INSTANCE_UP, lambda ev: self.scaling.on_instance_up(ev.target, self.clock.now()))
        loop.on(EventKind.SCALING, lambda ev: self.scaling.on_scaling(self.clock.now()))

    # -- running -----------------------------------------------------------------------
    @property
    def is_done(self) -> bool:
        return self.num_done >= len(self.trace)

    def run(self) -> dict[str, Any]:
        for _ in range(self.config.num_instances):
            inst = self.cluster.new_instance()
            if self.pd is not None:
                inst.on_boundary = self.pd.at_boundary
            self.policy.add_instance(inst)
        self.metrics.on_instances(0.0, self.cluster.num_live)
        for inst in self.cluster.instances.values():
            self._report(inst)
        if len(self.trace):
            self._next_arrival = float(self.trace.arrival_times[0])
            self.loop.push(Event(self._next_arrival, EventKind.ARRIVAL, 0))
        self.loop.push(Event(0.0, EventKind.STATUS_REPORT))
        if self.policy.enable_migration:
            self._next_reschedule = self.config.status_interval_s * self.config.reschedule_every
            self.loop.push(Event(self._next_reschedule, EventKind.RESCHEDULE))
        for ev in self.scaling.start():
            self.loop.push(ev)
        start, cpu = time.perf_counter(), time.process_time()
        # Past the last request, in-flight migrations still run to their end (an abort).
        num_requests = len(self.trace)
        self.loop.run(stop=lambda: self.num_done >= num_requests and not self._num_migrating)
        self.wall_s = time.perf_counter() - start
        self.cpu_s = time.process_time() - cpu
        return self.summary()

    def summary(self) -> dict[str, Any]:
        end = self.clock.now()
        out = self.metrics.summary(end)
        out["sim"] = {"duration_s": end, "wall_s": self.wall_s, "num_events": self.loop.num_events,
                      "events_per_s": self.loop.num_events / self.wall_s if self.wall_s else 0.0,
                      "cpu_s": self.cpu_s,
                      "num_steps": self.cluster.num_steps}
        if self.pd is not None:
            out["pd"] = self.pd.summary()
        if self.policy.enable_migration:
            out["rescheduling"] = self._rescheduling_summary()
        # Time-weighted share of the provisioned KV blocks in use (vLLM's cache usage),
        # over the instances up or starting.
        capacity = self.config.num_blocks * out["instances"]["average"] * end
        out["kv_usage_mean"] = self.cluster.block_seconds / capacity if capacity > 0 else 0.0
        return out

    def _rescheduling_summary(self) -> dict[str, Any]:
        """Rounds and passes; with the trigger on, its triggers and the reaction times
        (None without: marks are not computed then)."""
        out: dict[str, Any] = {"trigger_gap_s": self.config.trigger_gap_s, "num_rounds": self.num_rounds,
                               "num_passes": self.num_passes, "num_triggers": None, "reaction_s": None}
        if self._timer is not None:
            r = np.asarray(self.reaction_s, float)
            p50, p99 = np.percentile(r, [50, 99]) if r.size else (0.0, 0.0)
            out.update(num_triggers=self.num_triggers,
                       reaction_s={"count": int(r.size), "p50": float(p50), "p99": float(p99)})
        return out

    # -- arrivals and dispatch ---------------------------------------------------------
    def on_arrival(self, ev: Event) -> list[Event]:
        i: int = ev.target
        events: list[Event] = []
        if i + 1 < len(self.trace):
            self._next_arrival = float(self.trace.arrival_times[i + 1])
            events.append(Event(self._next_arrival, EventKind.ARRIVAL, i + 1))
        else:
            self._next_arrival = _INF
        if self.gateway:
            self._queue(i)  # behind the queue's higher-priority and earlier requests
            return events + self._drain_gateway()
        return events + self._dispatch(i)

    def _priority(self, i: int) -> int:
        return int(self.trace.priorities[i]) if self.priorities else 0

    def _queue(self, i: int) -> None:
        heapq.heappush(self.gateway, (-self._priority(i), float(self.trace.arrival_times[i]), i))

    def _dispatch(self, i: int) -> list[Event]:
        """Send request ``i`` to an instance, or queue it at the gateway if none is schedulable."""
        trace = self.trace
        priority = self._priority(i)
        num_prompt = int(trace.prompt_lens[i])
        tokens = trace.prompt_token_ids(i)
        name = None if self._slo_names is None else self._slo_names[i]
        try:
            iid = self.policy.dispatch(f"req-{i}", num_prompt, float(trace.arrival_times[i]), priority, tokens, name)
        except RequestShedError:  # the slo policy refused it early (a class with a shed share)
            self.metrics.on_shed(int(trace.priorities[i]), name)
            self._count_done(1)
            return []
        if iid is None:
            self._queue(i)
            return []
        inst = self.cluster.instances[iid]
        try:
            inst.engine.add_request(
                f"req-{i}", [0] * num_prompt if tokens is None else tokens,
                SamplingParams(max_tokens=int(trace.output_lens[i]), ignore_eos=True),
                priority=Priority.HIGH if priority else Priority.NORMAL,
                arrival_time=float(trace.arrival_times[i]), slo_class=name or "")
        except RequestTooLongError:
            self.metrics.num_rejected += 1
            self._count_done(1)
            return []
        inst.num_dispatched += 1
        events = inst.wake(self.clock.now())
        self._maybe_report(inst)
        return events

    def _drain_gateway(self) -> list[Event]:
        events: list[Event] = []
        while self.gateway:
            i = heapq.heappop(self.gateway)[2]
            before = len(self.gateway)
            out = self._dispatch(i)
            if len(self.gateway) > before:  # still nothing schedulable: it is back at the head
                break
            events += out
        return events

    # -- engine steps ------------------------------------------------------------------
    def on_step_end(self, ev: Event) -> list[Event]:
        inst: SimInstance = ev.target
        now = self.clock.now()
        outputs, events = inst.finish_step(now)
        finished = self.metrics.on_outputs(outputs, now)
        if finished:
            for out in finished:
                assert out.metrics is not None
                self.metrics.on_finished(out.metrics, *self._trace_class(out.request_id), request_id=out.request_id)
            self._count_done(len(finished))
        if self.config.check_invariants:
            inst.engine.check_invariants()
        if inst.load_changed:
            self._maybe_report(inst)
        if inst.is_terminating and self.policy.is_drained(inst):
            events += self._retire(inst)
        return events

    def _trace_class(self, request_id: str) -> tuple[int, str | None]:
        """The priority the trace gave ``req-<i>``, whatever the system ran it at, and the SLO
        class it names (None: the trace names none)."""
        i = int(request_id.rpartition("-")[2])
        return int(self.trace.priorities[i]), None if self._slo_names is None else self._slo_names[i]

    def _count_done(self, n: int) -> None:
        self.num_done += n
        if self.progress is not None:
            self.progress(n)

    # -- status ------------------------------------------------------------------------
    def _report(self, inst: SimInstance) -> None:
        if self.config.status_delay_s:  # dispatch (the gateway) reads it now, the rescheduler later
            status = self.policy.push(inst)
            self.policy.deliver(status, reschedule=False)
            self.loop.push(Event(self.clock.now() + self.config.status_delay_s, EventKind.STATUS_REPORT, status))
        elif self.policy.report(inst):
            self._on_triggered()
        if self.pd is not None:
            self.pd.on_report(inst.instance_id)
        inst.load_changed = False
        inst.reported_step = inst.engine.step_id

    def _on_triggered(self) -> None:
        self.num_triggers += 1
        if self._timer is not None:
            self._on_trigger()

    def _deliver(self, status: Any) -> list[Event]:
        """A status sent ``status_delay_s`` ago reaches the rescheduler (unless its
        instance has gone since)."""
        inst = self.cluster.instances.get(status.instance_id)
        if inst is not None and inst.is_up and self.policy.deliver(status, dispatch=False):
            self._on_triggered()
        return []

    def _is_read_before(self, t: float) -> bool:
        """Will a dispatch, a rescheduling round or the gateway read statuses before ``t``?"""
        # An arrival at exactly t runs before the round at t (kind order); rescheduling
        # and scaling at t run after it and read that round's reports.
        # With the trigger on, every report is read: by the trigger. A delayed report
        # (status_delay_s) may be read after t: none is skipped.
        return (self._next_arrival <= t or self._next_reschedule < t or self.scaling.next_at < t
                or bool(self.gateway) or self.pd is not None or self._timer is not None
                or self.config.status_delay_s > 0)

    def _maybe_report(self, inst: SimInstance) -> None:
        if inst.is_up and self.config.report_on_load_change and self._is_read_before(self._next_round):
            self._report(inst)

    def on_status_round(self, ev: Event) -> list[Event]:
        if ev.target is not None:  # a delayed status arriving (status_delay_s)
            return self._deliver(ev.target)
        if self.is_done:
            return []
        self._round += 1
        # Periodic times are multiples of the interval, never running sums, so a round
        # and a rescheduling round due at the same instant compare equal.
        self._next_round = self._round * self.config.status_interval_s
        if self._is_read_before(self._next_round):
            # Every instance reports, changed or not: an unchanged report still renews
            # the timestamp the dispatcher's staleness filter reads.
            for inst in self.cluster.instances.values():
                if inst.is_up:
                    self._report(inst)
        events = [Event(self._next_round, EventKind.STATUS_REPORT)]
        if self.pd is not None:  # PD reads every round: adaptive roles, deferred hand-offs
            events += self.pd.on_round(self.clock.now())
        if self.gateway:
            events += self._drain_gateway()
        return events

    # -- migration ---------------------------------------------------------------------
    def _on_trigger(self) -> None:
        """A report triggered a pass: run one now, or when the gap since the last ends."""
        timer = self._timer
        assert timer is not None and timer.min_gap_s is not None
        timer.on_trigger()
        if self._pass_at is None and not self.is_done:
            self._pass_at = max(self.clock.now(), timer.last_pass + timer.min_gap_s)
            self.loop.push(Event(self._pass_at, EventKind.RESCHEDULE, _PASS))

    def _on_pass(self) -> list[Event]:
        timer = self._timer
        assert timer is not None and timer.min_gap_s is not None
        self._pass_at = None
        if self.is_done or not timer.triggered:  # a round since answered the trigger
            return []
        now = self.clock.now()
        at = timer.last_pass + timer.min_gap_s
        if now < at:  # a round since moved the gap on, and a new trigger came
            self._pass_at = at
            return [Event(at, EventKind.RESCHEDULE, _PASS)]
        timer.ran("pass", now)
        self.num_passes += 1
        return self._pair_and_start(now)

    def on_reschedule(self, ev: Event) -> list[Event]:
        if ev.target is _PASS:
            return self._on_pass()
        if self.is_done:
            return []
        now = self.clock.now()
        self._resched_n += 1
        self._next_reschedule = self._resched_n * self.config.status_interval_s * self.config.reschedule_every
        self.num_rounds += 1
        if self._timer is not None:
            self._timer.ran("sweep", now)  # a round also answers any trigger before it
        return [Event(self._next_reschedule, EventKind.RESCHEDULE)] + self._pair_and_start(now)

    def _pair_and_start(self, now: float) -> list[Event]:
        """Pair sources with destinations and start a migration for each pair."""
        events: list[Event] = []
        instances = self.cluster.instances
        busy = [iid for iid, inst in instances.items() if inst.migrations_out or iid in self._starting]
        up = [iid for iid, inst in instances.items() if inst.is_up]
        for src_id, dst_id in pairs_to_start(self.policy.pair_migrations(), busy, up):  # as the cluster's round
            src, dst = instances.get(src_id), instances.get(dst_id)
            if src is not None and dst is not None:  # an earlier pair's abort may have retired one
                reaction = self.policy.on_order(src_id, dst_id)
                if reaction is not None:
                    self.reaction_s.append(reaction)
                if self.config.migration_start_s:
                    events.append(self._order(src, dst, now + self.config.migration_start_s))
                else:
                    events += self._migrate_next(src, dst, now)
        return events

    def _order(self, src: SimInstance, dst: SimInstance, at: float) -> Event:
        """The order reaches the source at ``at`` (``migration_start_s``): it picks the
        request then, and starts. Meanwhile it counts as migrating out (one chain a source)."""
        self._starting.add(src.instance_id)
        self._num_migrating += 1

        def arrive(now: float) -> list[Event]:
            self._starting.discard(src.instance_id)
            self._num_migrating -= 1
            instances = self.cluster.instances
            if instances.get(src.instance_id) is not src or instances.get(dst.instance_id) is not dst:
                return []  # one end went away meanwhile
            if not src.is_up or src.migrations_out:
                return []
            return self._migrate_next(src, dst, now)

        return Event(at, EventKind.MIGRATION_STAGE, OrderInFlight(arrive))

    def _migrate_next(self, src: SimInstance, dst: SimInstance, now: float) -> list[Event]:
        rid = self.policy.select_request(src, dst)
        if rid is None or rid in src.migrations_out or rid not in src.engine.requests:
            return []
        run = MigrationRun(src, dst, rid, self.config.migration, self.latency.migration, now,
                           on_done=self._on_migration_done)
        self.policy.on_migration_started(src, rid)
        self._num_migrating += 1
        return run.start(now)

    def _on_migration_done(self, run: MigrationRun, now: float) -> list[Event]:
        self._num_migrating -= 1
        report = run.protocol.report()
        run.on_report(self.metrics.on_migration)  # once the destination's first step with it began
        src, dst = run.src, run.dst
        self.policy.on_migration_finished(src, run.request_id, report.committed)
        self._maybe_report(src)
        self._maybe_report(dst)
        events: list[Event] = []
        if src.is_terminating and self.policy.is_drained(src):
            return self._retire(src)
        if (report.committed and not src.migrations_out and src.instance_id in
                self.cluster.instances and dst.instance_id in self.cluster.instances
                and self.policy.keep_migrating(src, dst)):
            events += self._migrate_next(src, dst, now)
        return events

    def _on_handoff_started(self) -> None:
        self._num_migrating += 1

    def _on_handoff_done(self, run: MigrationRun, now: float) -> list[Event]:
        self._num_migrating -= 1
        self._maybe_report(run.src)
        self._maybe_report(run.dst)
        return []

    def _retire(self, inst: SimInstance) -> list[Event]:
        if inst.instance_id not in self.cluster.instances:
            return []  # already retired: an abort below re-enters through _on_migration_done
        self.cluster.remove(inst.instance_id)
        inst.move(InstanceState.RETIRED)
        events: list[Event] = []
        # A run whose request finished here has not noticed yet (its stage is in flight).
        # Its abort frees the destination's reservation and may wake the destination:
        # keep those events, or the destination's next step would never end.
        for run in list(inst.migrations_out.values()):
            events += run.abort("source instance retired", self.clock.now())
        self.policy.remove_instance(inst)
        self.metrics.on_instances(self.clock.now(), self.cluster.num_live)
        return events
