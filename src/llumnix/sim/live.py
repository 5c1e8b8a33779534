"""A simulation run at wall-clock pace (or ``speed`` times faster), publishing the
cluster as the gateway's ``/admin/cluster`` lists it, so ``/dashboard`` and ``llumnix
top`` watch a simulated cluster as they watch a real one (``llumnix simulate --live``).

Pacing wraps the event loop's handlers: before an event at virtual time ``t`` runs,
the run sleeps until ``t / speed`` wall seconds have passed since its start (a run the
machine cannot keep up with runs flat out and says how far behind it is). The document
is built on the simulation's own thread every ``TICK_S`` wall seconds, never while a
handler runs, and handed to the server as bytes: readers never touch live state. Each
document has a ``version``; a reader may wait for the next one (``wait``: the page's
long poll, as the gateway's ``/admin/cluster?after=``).

Times in the document are ``epoch + virtual seconds`` (``epoch``: the wall clock at the
start), so the page's clock, its 5-minute chart and its rates are in simulated time.
"""
from __future__ import annotations

import json
import math
import threading
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from llumnix.gateway.metrics import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from llumnix.policy.freeness import freeness
from llumnix.sim.policy_bridge import PolicyBridge

if TYPE_CHECKING:
    from llumnix.migration.protocol import MigrationReport
    from llumnix.sim.events import Event
    from llumnix.sim.instance import SimInstance
    from llumnix.sim.loop import Handler
    from llumnix.sim.simulator import Simulator

TICK_S = 0.2
"""Wall seconds between two documents (each one a new version: the simulated time moved)."""
NUM_RECENT = 50
"""Migrations listed in ``recent``, as LlumSched's ``/admin/cluster``."""


class Histogram:
    """Non-cumulative bucket counts (the last: above every bound), the gateway's shape."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = [float(b) for b in bounds]
        self.counts = [0] * (len(bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1

    def doc(self) -> dict[str, Any]:
        return {"bounds": self.bounds, "counts": list(self.counts)}


class LiveRun:
    """One simulation, paced, and its latest ``/admin/cluster`` document (``body``)."""

    def __init__(self, name: str, sim: Simulator, speed: float, *, epoch: float | None = None,
                 start: float | None = None, label: str = "") -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        if not isinstance(sim.policy, PolicyBridge):
            raise TypeError("a live run reads the shared policy objects: its policy must be a PolicyBridge")
        self.name, self.sim, self.speed, self.label = name, sim, speed, label
        self.policy: PolicyBridge = sim.policy
        self.epoch = time.time() if epoch is None else epoch
        self.start = time.monotonic() if start is None else start
        """Wall (monotonic) time of virtual time 0: runs side by side share it."""
        self.body = b"{}"
        self.num_versions = 0
        self.closed = False
        """Set when the server stops: every reader waiting in ``wait`` answers."""
        self._cv = threading.Condition()
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._next_doc = 0.0
        self._ttft, self._itl = Histogram(TTFT_BUCKETS), Histogram(TOKEN_LATENCY_BUCKETS)
        self._num_requests_seen = self._num_gaps_seen = self._num_output_tokens = 0
        self._dispatched: dict[str, int] = {}
        self._behind_s = 0.0
        loop = sim.loop
        for kind, handler in list(loop.handlers.items()):
            loop.on(kind, self._paced(handler))
        self._publish(0.0)

    # -- pacing ----------------------------------------------------------------------
    def _paced(self, handler: Handler) -> Handler:
        def run(ev: Event) -> Any:
            self._wait_for(ev.time)
            return handler(ev)
        return run

    def _wait_for(self, t: float) -> None:
        """Sleep until virtual time ``t`` is due, publishing every ``TICK_S`` meanwhile."""
        due = self.start + t / self.speed
        while True:
            wall = time.monotonic()
            if wall >= self._next_doc:
                self._publish(min(t, (wall - self.start) * self.speed))
                self._next_doc = wall + TICK_S
            if wall >= due:
                self._behind_s = wall - due
                return
            time.sleep(min(due, self._next_doc) - wall)

    def run(self) -> None:
        """The whole simulation (on the calling thread); then the final document."""
        try:
            self.summary = self.sim.run()
            self._publish(self.sim.clock.now())
        except BaseException as e:  # noqa: BLE001 - LiveSession.wait reports it in one line
            self.error = e
        finally:
            self.done.set()

    # -- the document ----------------------------------------------------------------
    def _publish(self, now: float) -> None:
        doc = {**self.document(now), "version": f"sim-{self.num_versions + 1}"}
        body = json.dumps(doc, allow_nan=False).encode()
        with self._cv:
            self.body, self.num_versions = body, self.num_versions + 1
            self._cv.notify_all()

    def wait(self, after: str, timeout_s: float) -> bytes:
        """The document once its version is not ``after`` (at once if it already is not),
        or after ``timeout_s`` as it is."""
        with self._cv:
            self._cv.wait_for(lambda: self.closed or f"sim-{self.num_versions}" != after, timeout_s)
            return self.body

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def document(self, now: float) -> dict[str, Any]:
        """The cluster at virtual time ``now`` in ``/admin/cluster``'s shape (the fields
        the page and ``llumnix top`` read), plus ``sim``: where the run stands."""
        sim = self.sim
        insts = list(sim.cluster.instances.values())
        for inst in insts:
            self._dispatched[inst.instance_id] = inst.num_dispatched
        reactions = sorted(sim.reaction_s[-1000:])
        return {"source": "simulator", "dispatch_policy": self.policy.config.dispatch.policy,
                "num_dispatched": sum(self._dispatched.values()),
                "migrations": self._migrations(insts),
                "rescheduling": {"num_passes": sim.num_passes, "num_triggers": sim.num_triggers,
                                 "reaction": {"count": len(sim.reaction_s), "p50_s": _pct(reactions, 0.5),
                                              "p99_s": _pct(reactions, 0.99)}},
                "instances": [self._instance(inst) for inst in insts],
                "requests": self._requests(now),
                "pd": None if sim.pd is None else {"handoffs_recent": [self._report(m) for m in sim.pd.recent]},
                "sim": {"name": self.name, "label": self.label, "time_s": now, "speed": self.speed,
                        "published_at": time.time(),  # wall clock: how late a reader sees it
                        "behind_s": self._behind_s, "done": self.summary is not None,
                        "num_requests": len(sim.trace), "num_finished": len(sim.metrics.requests)}}

    def _instance(self, inst: SimInstance) -> dict[str, Any]:
        s = inst.llumlet.report(self.sim.clock.now())  # read-only: the engine's snapshot now
        free = freeness(s, self.policy.config.freeness)
        return {"instance_id": inst.instance_id, "freeness": free if math.isfinite(free) else None,
                "num_running": s.num_running, "num_waiting": s.num_waiting, "num_used_blocks": s.num_used_blocks,
                "num_total_blocks": s.num_total_blocks, "block_size": s.block_size,
                "is_terminating": inst.is_terminating, "is_schedulable": s.is_schedulable, "age_s": 0.0,
                "num_preemptions": s.num_preemptions, "role": self.policy.roles.get(inst.instance_id, "mixed"),
                "lifecycle": inst.state.name.lower(), "lifecycle_reason": None}

    def _migrations(self, insts: list[SimInstance]) -> dict[str, Any]:
        reports = self.sim.metrics.migrations
        committed = [m for m in reports if m.committed]
        downtimes = [m.downtime for m in committed if m.downtime is not None and not m.was_queued]
        return {"committed": len(committed), "committed_queued": sum(m.was_queued for m in committed),
                "committed_running": sum(not m.was_queued for m in committed),
                "aborted": len(reports) - len(committed),
                "in_flight": sorted(i.instance_id for i in insts if i.migrations_out),
                "recent_downtimes_s": downtimes[-1000:], "downtime_s": downtimes[-20:],
                "recent": [self._report(m) for m in reports[-NUM_RECENT:]]}

    def _report(self, m: MigrationReport) -> dict[str, Any]:
        return {"request_id": m.request_id, "src_instance_id": m.src_instance_id,
                "dst_instance_id": m.dst_instance_id, "committed": m.committed, "abort_reason": m.abort_reason,
                "abort_code": m.abort_code, "end_time": self.epoch + m.end_time, "downtime": m.downtime,
                "was_queued": m.was_queued, "reported_at": self.epoch + m.end_time}

    def _requests(self, now: float) -> dict[str, Any]:
        """The gateway's cumulative request counters, kept up from the run's metrics."""
        metrics = self.sim.metrics
        for r in metrics.requests[self._num_requests_seen:]:
            self._num_output_tokens += r.num_output_tokens
            if r.ttft is not None:
                self._ttft.observe(r.ttft)
        self._num_requests_seen = len(metrics.requests)
        gaps = metrics.token_gaps
        for g in gaps[self._num_gaps_seen:]:
            self._itl.observe(g)
        self._num_gaps_seen = len(gaps)
        return {"time": self.epoch + now, "num_finished": self._num_requests_seen,
                "num_output_tokens": self._num_output_tokens, "ttft": self._ttft.doc(), "itl": self._itl.doc()}


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None
