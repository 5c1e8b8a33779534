"""SimExecutor: the engine's Executor with a latency model in place of a network."""
from __future__ import annotations

from llumnix.core.batch import ModelOutput, SchedulerOutput
from llumnix.sim.latency import LatencyModel

PLACEHOLDER_TOKEN = 0


class HostSteps:
    """How many of one host's instances are mid-step; their executors share it."""

    __slots__ = ("num_stepping",)

    def __init__(self) -> None:
        self.num_stepping = 0


class SimExecutor:
    """Returns placeholder tokens and the modelled step latency in ``elapsed``.

    Decode steps that overlap a migration's KV copy on this instance pay the model's
    migration slowdown: every step started while a copy runs (``num_copying`` > 0),
    and the first one after a copy started (the copy may begin and end within the
    step that was already running).

    With ``host`` (instances sharing a machine) and a model with ``contention`` factors,
    a step that starts while another instance of the host is mid-step takes the
    factor longer (``NeighborContention``); ``step_done`` ends the step's share.

    Every step also pays the model's ``step_overhead_s`` (the serving loop's own work)
    and ``seq_overhead_s`` per sequence in its batch, before those factors.
    """

    def __init__(self, model: LatencyModel, host: HostSteps | None = None) -> None:
        self.model = model
        self._host = None if model.contention.is_neutral else host
        self._contention = model.contention
        self._in_step = False
        self.num_copying = 0
        self.last_slowed = False
        self._copy_started = False
        self.num_steps = 0
        self.busy_time = 0.0
        self.last_elapsed = 0.0
        self._slowdown = model.migration.decode_slowdown
        self._overhead = model.step_overhead_s
        self._seq_overhead = model.seq_overhead_s

    def begin_copy(self) -> None:
        self.num_copying += 1
        self._copy_started = True

    def end_copy(self) -> None:
        self.num_copying -= 1

    def execute(self, batch: SchedulerOutput) -> ModelOutput:
        sched = batch.scheduled
        n = len(sched)
        overhead = self._overhead + self._seq_overhead * n
        if batch.is_prefill:
            t = self.model.prefill_time([r.start_pos + len(r.token_ids) for r in sched]) + overhead
            cached = [r.start_pos for r in sched if r.start_pos]
            if cached:
                # Prefix-cache hits: only the tokens after the cached prefix are computed.
                # Their cost is the model's marginal one, prefill(cached + new) -
                # prefill(cached): the linear term of the new tokens and the attention of
                # the new tokens over the whole context.
                model = self.model
                t -= max(0.0, model.prefill_time(cached) - model.prefill_time(()))
        else:
            # A decode entry computes one token: its context is start_pos + 1.
            ctx = n
            for r in sched:
                ctx += r.start_pos
            t = self.model.decode_time(n, ctx) + overhead
            self.last_slowed = bool(self.num_copying or self._copy_started)
            if self.last_slowed:
                t *= self._slowdown
                self._copy_started = False
        host = self._host
        if host is not None:
            if host.num_stepping:
                t *= self._contention.prefill if batch.is_prefill else self._contention.decode
            host.num_stepping += 1
            self._in_step = True
        self.num_steps += 1
        self.busy_time += t
        self.last_elapsed = t
        return ModelOutput(sampled_token_ids=[PLACEHOLDER_TOKEN] * n, elapsed=t)

    def step_done(self) -> None:
        """The step that ``execute`` timed has ended (or its instance went away)."""
        if self._in_step:
            self._in_step = False
            assert self._host is not None
            self._host.num_stepping -= 1
