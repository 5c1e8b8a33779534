"""SimExecutor: the engine's Executor with a latency model in place of a network."""
from __future__ import annotations

from llumnix.core.batch import ModelOutput, ScheduledRequest, SchedulerOutput, timed_output
from llumnix.sim.latency import LatencyModel

PLACEHOLDER_TOKEN = 0


class HostSteps:
    """How many of one host's instances are mid-step; their executors share it."""

    __slots__ = ("num_stepping",)

    def __init__(self) -> None:
        self.num_stepping = 0


def _decode_context(entries: list[ScheduledRequest]) -> int:
    """Context tokens of decode entries: each computes one token after its start_pos."""
    ctx = len(entries)
    for r in entries:
        ctx += r.start_pos
    return ctx


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
        if batch.is_prefill:
            n = batch.num_entries
            t = self._prefill_time(batch, n)
        else:
            decode = batch.decode
            if decode is not None:  # a decode step's size and context: no entry is built for the model
                n = len(decode.requests)
                ctx = decode.num_context_tokens
            else:
                n = len(batch.scheduled)
                ctx = _decode_context(batch.scheduled)
            t = self.model.decode_time(n, ctx) + (self._overhead + self._seq_overhead * n)
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
        return timed_output([PLACEHOLDER_TOKEN] * n, t)

    def _prefill_time(self, batch: SchedulerOutput, n: int) -> float:
        """A step with prefill chunks (and, chunked, decodes): ``n`` entries in all."""
        sched = batch.scheduled
        model = self.model
        nd = batch.num_decodes
        prefills = sched[nd:] if nd else sched
        t = model.prefill_time([r.start_pos + len(r.token_ids) for r in prefills]) + (
            self._overhead + self._seq_overhead * n)
        cached = [r.start_pos for r in prefills if r.start_pos]
        if cached:
            # Prefix-cache hits and the chunks after a prefill's first: only the tokens
            # after start_pos are computed. Their cost is the model's marginal one,
            # prefill(start + new) - prefill(start): the linear term of the new tokens
            # and the attention of the new tokens over the whole context.
            t -= max(0.0, model.prefill_time(cached) - model.prefill_time(()))
        if nd:
            # A step that mixes decodes into a prefill (chunked prefill) pays their
            # marginal cost: their tokens through the linear layers as prefill tokens,
            # and the decode model's per-sequence and context (KV read) terms; its
            # fixed cost (the weights read once) is the prefill's. Not calibrated:
            # the paper's engine had no mixed steps.
            t += (max(0.0, model.prefill_time([1] * nd) - model.prefill_time(()))
                  + max(0.0, model.decode_time(nd, _decode_context(sched[:nd])) - model.decode_time(0, 0)))
        return t

    def step_done(self) -> None:
        """The step that ``execute`` timed has ended (or its instance went away)."""
        if self._in_step:
            self._in_step = False
            assert self._host is not None
            self._host.num_stepping -= 1
