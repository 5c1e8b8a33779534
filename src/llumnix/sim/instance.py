"""One simulated instance: an EngineCore stepping in virtual time with a SimExecutor.

The engine's step is split so time passes between its parts::

    schedule() ──► execute() gives the modelled latency ──► [virtual time passes] ──► update()
    t                                                                                 t + elapsed

Migration actions that need a step boundary (pausing a request for its last stage)
wait in ``at_boundary`` and run right after ``update``, before the next ``schedule``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llumnix.core.batch import ModelOutput, RequestOutput, SchedulerOutput
from llumnix.engine import EngineCore
from llumnix.policy.lifecycle import InstanceState, can_move
from llumnix.sim.events import Event, EventKind
from llumnix.sim.executor import SimExecutor

if TYPE_CHECKING:
    from llumnix.sim.migration import MigrationRun


class SimInstance:
    def __init__(self, instance_id: str, engine: EngineCore, executor: SimExecutor,
                 llumlet: Any = None, *, up_since: float = 0.0) -> None:
        self.instance_id = instance_id
        self.engine = engine
        self.executor = executor
        self.llumlet = llumlet
        self.up_since = up_since
        self.is_up = True
        """Started and not gone: it steps, reports and may be paired (kept with ``state``:
        read for every instance at every status round)."""
        self.is_terminating = False
        """Draining for scale-in (kept with ``state``: read at every step end)."""
        self.state = InstanceState.SERVING
        self.migrations_out: dict[str, MigrationRun] = {}
        self.migrations_in: dict[str, MigrationRun] = {}
        self.at_boundary: list[Callable[[float], list[Event]]] = []
        self.on_boundary: Callable[[SimInstance, float], list[Event]] | None = None
        """Called at every step boundary, after ``at_boundary``, before the next step is
        scheduled (PD hand-offs start there, so a request can be paused before it)."""
        self.num_dispatched = 0
        self.reported_step = -1
        self.load_changed = True
        """The request set changed since the last status report (a push is due)."""
        self._batch: SchedulerOutput | None = None
        self._output: ModelOutput | None = None
        self._step_end = Event(0.0, EventKind.STEP_END, self)
        """The event of the step in flight, one object reused for every step: a step's end
        has been popped before the next step starts (only ``finish_step`` clears
        ``_batch``), and the loop keeps no event it has handled."""
        self._num_requests = 0
        self.block_seconds = 0.0
        """Integral of the KV blocks in use over time (blocks held during each step)."""

    @property
    def state(self) -> InstanceState:
        """Where it is in the lifecycle every part of Llumnix shares (policy/lifecycle.py)."""
        return self._state

    @state.setter
    def state(self, to: InstanceState) -> None:
        self._state = to
        self.is_up = to in (InstanceState.SERVING, InstanceState.TERMINATING)
        self.is_terminating = to == InstanceState.TERMINATING

    def move(self, to: InstanceState) -> None:
        if not can_move(self.state, to):
            raise RuntimeError(f"{self.instance_id}: {self.state.name} -> {to.name} is not a lifecycle transition")
        self.state = to

    @property
    def is_busy(self) -> bool:
        """A step is in flight."""
        return self._batch is not None

    def start_step(self, now: float) -> Event | None:
        """Schedule and execute the next batch; its end is the returned event. None: idle."""
        if self._batch is not None or not self.is_up:
            return None
        engine = self.engine
        batch = engine.schedule()
        if batch.is_empty:
            if batch.preempted_request_ids:
                self.load_changed = True
            return None
        if batch.is_prefill or batch.preempted_request_ids:
            self.load_changed = True
        self._batch = batch
        self._output = out = self.executor.execute(batch)
        elapsed = out.elapsed or 0.0
        kv = engine.kv
        self.block_seconds += (kv.pool.num_blocks - kv.num_free_blocks) * elapsed  # KVManager.num_used_blocks
        ev = self._step_end
        ev.time = now + elapsed
        return ev

    def finish_step(self, now: float) -> tuple[list[RequestOutput], list[Event]]:
        """Apply the step's outputs, run step-boundary actions; returns the outputs and
        the events caused (the next step's end, migration stages)."""
        batch, out = self._batch, self._output
        assert batch is not None and out is not None
        self._batch = self._output = None
        self.executor.step_done()
        outputs = self.engine.update(batch, out)
        if self.llumlet is not None and self.llumlet.records_steps:  # the slo predictor's samples
            self.llumlet.on_step(batch, out.elapsed or 0.0)
        n = len(self.engine.requests)
        if n != self._num_requests:
            self._num_requests = n
            self.load_changed = True
        events: list[Event] = []
        if self.at_boundary:
            actions, self.at_boundary = self.at_boundary, []
            for act in actions:
                events.extend(act(now))
        if self.on_boundary is not None:
            events.extend(self.on_boundary(self, now))
        nxt = self.start_step(now)
        if nxt is not None:
            events.append(nxt)
        return outputs, events

    def wake(self, now: float) -> list[Event]:
        """Start stepping if idle (new work arrived or blocks were freed)."""
        self.load_changed = True
        if self._batch is not None:
            return []
        nxt = self.start_step(now)
        return [] if nxt is None else [nxt]

    def note_requests_changed(self) -> None:
        self._num_requests = len(self.engine.requests)
        self.load_changed = True
