"""Step pacing: each engine step lasts at least what a latency model prices it at.

For evaluating scheduling on a shared CPU as if each instance had its own device (issue
45), never for serving. Instances that share two cores are bound by compute long before
their KV caches fill, so migration (which balances KV) has nothing to do; with every
step stretched to a device's modeled step time, and the model's real computation
well under it, each instance's throughput is its own again, and KV binds as on the
paper's GPUs, while requests, KV caches and migrations stay real.

A step is priced exactly as the simulator prices it (``sim.executor.SimExecutor``
over the same latency model, times ``scale``), and the remainder of its window is slept
on the step thread (``time.sleep``: the GIL is free meanwhile) before the step's outputs
are made. The simulator's step is the whole cycle from one step's start to the next's
(the model's ``step_overhead_s`` is the serving loop's own work), so while the engine
steps back to back a step's window starts where the previous one ended: the update,
the outputs' delivery, the status and the commands at the boundary are part of it, not
added to it. After an idle spell (nothing running or waiting) the window starts when
the step does. A cycle whose real work already took longer is an overrun: counted, so a
run can say whether the emulation held.

    modeled = model(batch) x scale      real = loop + schedule + execute
    |-- update, loop --|-- schedule --|-- execute --|..... sleep .....|-- update, loop --|
    w (previous window's end)                                          w + modeled

The model's migration slowdown and neighbor contention are not applied: the pacer sees
no KV copies, and a paced instance stands for one with a device of its own.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llumnix.core.batch import SchedulerOutput
from llumnix.sim.executor import SimExecutor
from llumnix.sim.latency import NO_CONTENTION, LatencyModel, MigrationCost, NeighborContention


@dataclass(frozen=True)
class PacedLatencyModel:
    """``base``'s step times times ``scale``, on a device of its own (no neighbor
    contention): what a paced engine emulates, and what the simulator must price its
    steps with to predict a paced cluster. Migration costs stay ``base``'s."""

    base: LatencyModel
    scale: float
    migration: MigrationCost
    """``base.migration`` (a field, so the simulator can replace its stage costs)."""
    contention: NeighborContention = NO_CONTENTION

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"the pace's scale must be > 0, got {self.scale:g}")

    @property
    def step_overhead_s(self) -> float:
        return self.base.step_overhead_s * self.scale

    @property
    def seq_overhead_s(self) -> float:
        return self.base.seq_overhead_s * self.scale

    def prefill_time(self, seq_lens: Sequence[int]) -> float:
        return self.base.prefill_time(seq_lens) * self.scale

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float:
        return self.base.decode_time(batch_size, num_context_tokens) * self.scale


def pace_model(name: str, scale: float = 1.0) -> PacedLatencyModel:
    """The latency model ``name`` (a preset, or a profile JSON's path: ``get_latency_model``)
    paced at ``scale``; ``ValueError`` naming the known presets when it is neither."""
    from llumnix.sim.latency import PRESETS, get_latency_model
    from llumnix.sim.profile import ProfileError

    try:
        base = get_latency_model(name)
    except ProfileError as e:
        raise ValueError(f"unknown latency model {name!r}: not one of {', '.join(PRESETS)}, nor a profile "
                         f"JSON ({e})") from None
    return PacedLatencyModel(base, scale, base.migration)


class StepPacer:
    """Holds an engine's steps to a latency model's times (``EngineCore.step`` calls
    ``pace`` between a step's execution and its update)."""

    def __init__(self, model: PacedLatencyModel, *, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.model = model
        self.clock = clock
        self._sleep = sleep
        self._pricer = SimExecutor(model)  # the simulator's own pricing of a batch
        self.num_paced_steps = 0
        self.num_overrun_steps = 0
        """Steps whose real work took longer than their modeled time (not stretched)."""
        self.overrun_s = 0.0
        """Seconds those steps took beyond their modeled times, summed."""
        self.slept_s = 0.0
        self._window_end: float | None = None
        """Where the previous step's window ended while the engine steps back to back (None: idle)."""

    def begin(self) -> float:
        """When the step starting now began its window: the previous window's end while
        the engine steps back to back, else now."""
        end = self._window_end
        return self.clock() if end is None else end

    def idle(self) -> None:
        """Nothing is left to step: the next step's window starts when it does."""
        self._window_end = None

    def modeled_s(self, batch: SchedulerOutput) -> float:
        elapsed = self._pricer.execute(batch).elapsed
        assert elapsed is not None
        return elapsed

    def pace(self, batch: SchedulerOutput, started: float) -> None:
        """Sleep until ``started`` (``begin``'s answer when the step began) plus the batch's
        modeled time; count an overrun when that time has passed already."""
        end = started + self.modeled_s(batch)
        left = end - self.clock()
        self.num_paced_steps += 1
        if left > 0:
            self.slept_s += left
            self._sleep(left)
        else:
            self.num_overrun_steps += 1
            self.overrun_s -= left
            end -= left  # the next window starts from the real end, not the missed one
        self._window_end = end

    def counts(self) -> dict[str, float]:
        """What an instance's status carries (``InstanceStatus.extra``, then ``/metrics``)."""
        return {"num_paced_steps": float(self.num_paced_steps),
                "num_pace_overrun_steps": float(self.num_overrun_steps),
                "pace_overrun_s": self.overrun_s}
