"""A request's predicted TTFT and TPOT on one instance, from its status and the step-time
model (``policy/predictor.py``); what the ``predicted-slo`` scorer and rescue read.

TTFT on a candidate = what is left of the step under way (half a decode step), the wait
for memory when the queue ahead and the request need more blocks than are free (until
the running requests expected to end first have freed enough), and the prefills of the
queue ahead (higher priority, and of its own those due first with the engines' ``deadline``
order, else all: the engine serves by priority, then deadline or arrival) and of the
request itself: each a prefill step of its own, or, on an engine whose step reports
mix prefills into decode steps (chunked prefill), one step that prefills them all beside
the running requests' decodes.

TPOT = the decode step of the batch after the request joins (running, queued and the
request, their contexts), stretched by the share of the instance's time that prefills
take (``prefill_share``: the cluster's prefill work per second per instance, which the
predictor follows from dispatches): a prefill-first engine stalls every decode for it.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, replace

from llumnix.core.status import InstanceStatus, RequestBrief, StepSample
from llumnix.engine.objectives import URGENT_SHARE
from llumnix.policy.freeness import blocks_for
from llumnix.policy.predictor import OutputLengths, StepTimeModel, sample_features
from llumnix.policy.slo import SLOConfig

LOG_SIZE = 100_000
"""Dispatches whose predicted TTFT is kept (``ttft_log``), and steps whose predicted time is
(``step_log``)."""
_MAX_SHARE = 0.6
"""Cap on the prefill share (beyond it the instance is overloaded and TPOT predictions
stop meaning much; the cap keeps them finite)."""


@dataclass(frozen=True)
class InstanceLoad:
    """What predictions read of one status, computed once per status object."""

    num_running: int
    num_context_tokens: int
    """Context tokens of the running requests (and of those sent since the report)."""
    queued: tuple[tuple[int, int], ...]
    """(priority, prompt tokens) of each queued request, in service order, but the overdue."""
    num_free_blocks: int
    """Free blocks beyond the watermark."""
    release: tuple[tuple[float, int], ...]
    """(expected remaining output tokens, blocks) per running request, soonest first."""
    tightest_tpot_s: float | None
    """The tightest TPOT objective among the running requests' classes (None: none run)."""
    block_size: int
    steps: StepTimeModel
    """The instance's own step-time model (fitted on its step reports)."""
    overdue: tuple[tuple[int, int], ...] = ()
    """(priority, prompt tokens) of the queued requests past their TTFT objective, which
    the engine serves after the rest (``SLOConfig.engine_order``): no newcomer waits for
    them, but they will join the batch."""
    queued_due: tuple[float, ...] = ()
    """With the engines' ``deadline`` order, each of ``queued``'s deadline (``deadline``: for a
    first token, arrival + its class's TTFT objective): a newcomer of the same priority waits only for
    those due before it (empty: every queued request of its priority or above is ahead)."""
    queued_banked: tuple[bool, ...] = ()
    """With ``queued_due``: whether each of ``queued`` has tokens banked (preempted back into
    the queue). The engine serves a newcomer of its priority before those due after it, and
    the TTFT to expect says so; dispatch counts them ahead of it all the same, so that it does
    not place a request where it would push them back. Placing by the engine's order instead,
    goal.yaml's goodput rose from 44, 44, 48, 40, 28 req/s (seeds 0-4) to 44, 48, 56, 40, 32,
    and interactive attainment at those rates fell from 0.968 to 0.947 (the goal: 0.95), so
    dispatch keeps the interactive class's margin (benchmarks/slo/README.md)."""
    max_num_seqs: int = 0
    """The engine's batch cap (0: none known). A request beyond it waits for a running one
    to end, as for blocks (the CPU engine's 32 sequences fill in a burst at 0.85 load; the
    0.18 s predictions of 1.1-1.5 s TTFTs that first showed it in session 35 were also the
    clock defect's, ``engine/status_builder.py``)."""
    runners: tuple[tuple[int, float, int], ...] = ()
    """Where the engine preempts for deadlines (``InstanceStatus.preempts_for_deadlines``):
    (priority, due, blocks) of each running request, due = its ``deadline``. A queued head
    may preempt the lower priorities at once and, once urgent (``URGENT_SHARE`` of its
    objective passed), those of its own due after it (``engine/objectives.py``): its wait for
    blocks or a place in the batch is at most that (``preempt_wait``)."""


def is_overdue(w: RequestBrief, now: float, limits: dict[str, float], slo: SLOConfig) -> bool:
    """A queued request past its class's limit with no output yet (``engine/objectives.py``)."""
    limit = limits.get(w.slo_class or slo.class_of("", w.priority).name) if limits else None
    return limit is not None and not w.num_output_tokens and now - w.arrival_time > limit


def deadline(r: RequestBrief, slo: SLOConfig) -> float:
    """The engine's deadline for ``r`` (``Objectives.deadline``), its first token taken at its
    arrival (a brief does not carry it; TTFTs are mostly far shorter than the objectives): the
    TTFT objective's before its first token, after it its TPOT objective per token made. A
    request preempted back into the queue, or running, with tokens banked is due late. Taken
    due at arrival + TTFT objective, as before, such requests counted ahead of every newcomer
    of their class: on goal.yaml's seed 0 at 36 req/s, 108 batch requests predicted to wait
    a median 5.9 s for memory got their first token within 0.1 s, and batch TTFTs were
    predicted a median 72% late (``benchmarks/slo/ttft_causes.py``)."""
    cls = slo.class_of(r.slo_class, r.priority)
    n = r.num_output_tokens
    return r.arrival_time + (cls.tpot_s * n if n else cls.ttft_s)


def instance_load(s: InstanceStatus, slo: SLOConfig, lengths: OutputLengths, steps: StepTimeModel,
                  overdue_limits: dict[str, float] | None = None) -> InstanceLoad:
    """``overdue_limits``: ``SLOConfig.overdue_limits()`` (the engine's, as of the status's time)."""
    ctx = sum(r.num_tokens for r in s.running)
    release = sorted((lengths.remaining(r.num_output_tokens), r.num_blocks) for r in s.running)
    tpots = {slo.class_of(r.slo_class, r.priority).tpot_s for r in s.running}
    queued: list[tuple[int, int]] = []
    overdue: list[tuple[int, int]] = []
    due: list[float] = []
    banked: list[bool] = []
    limits = overdue_limits or {}
    by_deadline = slo.engine_order == "deadline"
    runners = tuple((r.priority, deadline(r, slo), r.num_blocks) for r in s.running) \
        if s.preempts_for_deadlines else ()
    for w in s.waiting:
        if is_overdue(w, s.timestamp, limits, slo):
            overdue.append((w.priority, w.num_tokens))
            continue
        queued.append((w.priority, w.num_tokens))
        if by_deadline:
            due.append(deadline(w, slo))
            banked.append(w.num_output_tokens > 0)
    return InstanceLoad(len(s.running), ctx, tuple(queued), s.num_free_blocks - s.num_watermark_blocks,
                        tuple(release), min(tpots) if tpots else None, s.block_size, steps, tuple(overdue),
                        tuple(due), tuple(banked), s.max_num_seqs, runners)


def preempt_wait(load: InstanceLoad, deficit: int, slots: int, priority: int, due: float, ttft_s: float) -> float:
    """How long a queued head of ``priority`` due at ``due`` waits before the engine's deadline
    order lets it take ``deficit`` blocks and ``slots`` places in the batch from running
    requests: at once from lower priorities, after ``URGENT_SHARE`` of its objective from its
    own priority's requests due after it; inf when they do not hold enough."""
    now_blocks = now_seqs = later_blocks = later_seqs = 0
    for p, d, blocks in load.runners:
        if p < priority:
            now_blocks += blocks
            now_seqs += 1
        elif p == priority and d > due:
            later_blocks += blocks
            later_seqs += 1
    if now_blocks >= deficit and now_seqs >= slots:
        return 0.0
    if now_blocks + later_blocks >= deficit and now_seqs + later_seqs >= slots:
        return URGENT_SHARE * ttft_s
    return math.inf


def joining(behind: list[int], num_free_blocks: int, seats: int, block_size: int) -> list[int]:
    """Of the queued requests behind a newcomer (prompt tokens, in service order), those an
    engine without chunked prefill admits in the newcomer's own prefill step: after it, while
    blocks and places last (a queue that fits has arrived since the step under way began).
    Its first token waits for their prefills too: interactive requests whose TTFT was 0.3-1 s
    on goal.yaml's seed 0 at 36 req/s were predicted a median 0.13 s, their own prefill step
    taking 0.31 s against 0.04 s predicted for their prompt alone."""
    out: list[int] = []
    for n in behind:
        blocks = blocks_for(n + 1, block_size)
        if blocks > num_free_blocks or seats < 1:
            break
        num_free_blocks -= blocks
        seats -= 1
        out.append(n)
    return out


class SLOPredictor:
    """Step-time models (one per instance, fitted on the step samples its statuses carry),
    output lengths and the cluster's prefill load, with predictions per (instance load,
    request). One per global scheduler; ``now`` always comes in."""

    def __init__(self, slo: SLOConfig, steps: StepTimeModel | None = None, *, window_s: float = 10.0) -> None:
        self.slo = slo
        self.steps = steps or StepTimeModel()
        """The seed: each instance's model starts as a copy of it."""
        self._models: dict[str, StepTimeModel] = {}
        self._latest = self.steps
        """The model fitted last (the cluster's prefill load is measured with it)."""
        self.num_steps_fitted = 0
        self.step_log: deque[tuple[float, StepSample, str]] = deque(maxlen=LOG_SIZE)
        """Each step reported, with the seconds its instance's model predicted for it before
        fitting it (against ``StepSample.seconds``: the predictor's step-time error) and the
        instance."""
        self.lengths = OutputLengths(slo.output_tokens)
        self.overdue_limits = slo.overdue_limits()
        """What the engines serve last (``SLOConfig.engine_order``), which no newcomer waits for."""
        self.window_s = window_s
        self._prefills: list[tuple[float, float]] = []
        """(dispatch time, predicted prefill seconds) over the last ``window_s``."""
        self._prefill_sum = 0.0
        self._first = 0.0
        self.num_instances = 1
        self._memo: dict[str, tuple[InstanceStatus, InstanceLoad]] = {}
        """What ``load`` derived from each instance's status object, valid while that object is
        the view's (a cache of ``ClusterView``'s status, not a record of its own)."""
        self.ttft_log: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Per dispatched request id: (arrival time, TTFT predicted on the instance chosen),
        the last ``LOG_SIZE``: what the predictor's TTFT error is measured on."""

    # -- what it follows -------------------------------------------------------------
    def record_ttft(self, request_id: str, arrival_time: float, predicted_s: float) -> None:
        self.ttft_log[request_id] = (arrival_time, predicted_s)
        if len(self.ttft_log) > LOG_SIZE:
            self.ttft_log.popitem(last=False)

    def on_dispatch(self, now: float, num_prompt_tokens: int) -> None:
        if not self._prefills:
            self._first = now
        t = self._latest.prefill_s((num_prompt_tokens,))
        self._prefills.append((now, t))
        self._prefill_sum += t
        horizon = now - self.window_s
        i = 0
        while i < len(self._prefills) and self._prefills[i][0] < horizon:
            self._prefill_sum -= self._prefills[i][1]
            i += 1
        if i:
            del self._prefills[:i]

    def seed(self, steps: StepTimeModel) -> None:
        """A new seed (a latency model's fit): every instance's model starts over from it."""
        self.steps = self._latest = steps
        self._models.clear()
        self._memo.clear()

    def model(self, instance_id: str) -> StepTimeModel:
        m = self._models.get(instance_id)
        if m is None:
            m = self._models[instance_id] = self.steps.copy()
        return m

    def on_status(self, old: InstanceStatus, new: InstanceStatus) -> None:
        """The steps ``new`` reports fit its instance's model (a status seen again, as a
        channel's heartbeat resends the newest, fits nothing). Requests running in ``old``
        and gone from ``new`` without migrating finished: their output lengths (as of
        ``old``) teach the output-length estimate."""
        if new.step_samples and new.timestamp > old.timestamp:
            m = self._latest = self.model(new.instance_id)
            log = self.step_log.append
            for sample in new.step_samples:
                m.mixes = m.mixes or bool(sample.num_prefill_seqs and sample.num_decode_seqs)
                x = sample_features(sample)
                log((m.predict_features(x), sample, new.instance_id))
                m.observe_features(x, sample.seconds)
            self.num_steps_fitted += len(new.step_samples)
        if len(old.running) <= len(new.running) and old.step_id == new.step_id:
            return
        still = {r.request_id for r in (*new.running, *new.waiting)}  # preempted ones wait
        for r in old.running:
            if r.request_id not in still and not r.is_migrating and r.num_output_tokens:
                self.lengths.observe(r.num_output_tokens)

    def step_error(self, last: int = 1000) -> dict[str, float]:
        """The step-time error over the last ``last`` steps fitted: |predicted / measured - 1|
        at P50 and P90 (what ``/metrics`` exports), and how many steps were fitted in all."""
        n = min(last, len(self.step_log))
        errs = sorted(abs(p / s.seconds - 1) for p, s, _ in list(self.step_log)[len(self.step_log) - n:]
                      if s.seconds > 0)
        out = {"num_steps_fitted": float(self.num_steps_fitted)}
        if errs:
            out |= {"p50": errs[len(errs) // 2], "p90": errs[min(len(errs) - 1, int(0.9 * len(errs)))]}
        return out

    def prefill_share(self, now: float) -> float:
        """Share of an instance's time its prefills take (cluster-wide prefill seconds per
        second over the window, per instance), capped."""
        span = min(self.window_s, max(1.0, now - self._first))
        return min(_MAX_SHARE, self._prefill_sum / span / max(1, self.num_instances))

    def load(self, s: InstanceStatus) -> InstanceLoad:
        entry = self._memo.get(s.instance_id)
        if entry is not None and entry[0] is s:
            return entry[1]
        load = instance_load(s, self.slo, self.lengths, self.model(s.instance_id), self.overdue_limits)
        self._memo[s.instance_id] = (s, load)
        return load

    def forget(self, instance_id: str) -> None:
        self._memo.pop(instance_id, None)
        self._models.pop(instance_id, None)

    # -- predictions -------------------------------------------------------------------
    def ttft(self, load: InstanceLoad, num_prompt_tokens: int, priority: int, due: float | None = None,
             *, objective_s: float | None = None) -> float:
        """``due``: when the request is due its first token (arrival + its class's TTFT): with
        the engines' deadline order it waits for the queued requests of its priority due
        before it only (None: for all of them). It waits for blocks and for a place in the
        batch as the running requests expected to end first free them (``memory_wait``).

        With ``objective_s`` (its class's TTFT objective) too, that wait is at most what the
        engine's deadline preemption leaves of it (``preempt_wait``): the TTFT to expect,
        which is recorded against the measured one and tells a shed request when to retry.
        Dispatch leaves it out: it places a request where it meets its objectives without
        taking blocks or places from anyone. Placing by the expected TTFT sent interactive
        requests where they would preempt batch ones, and goal.yaml's batch attainment at
        40 req/s (seed 0) fell from 0.947 to 0.848 (benchmarks/slo/README.md).

        The TTFT to expect counts too the queued requests behind it that share its prefill
        step (``joining``); dispatch does not: scoring with them, goal.yaml's goodput (seeds
        0-4, 28-56 req/s) was 44, 48, 52, 44, 28 req/s against 44, 48, 56, 40, 32 without."""
        steps = load.steps
        step = steps.decode_s(load.num_running, load.num_context_tokens) if load.num_running else 0.0
        ahead: list[int] = []
        behind: list[int] = []
        if due is None or not load.queued_due:
            for p, n in load.queued:
                (ahead if p >= priority else behind).append(n)
        else:
            first = objective_s is None  # dispatch: a banked request of its priority is ahead (queued_banked)
            for (p, n), d, b in zip(load.queued, load.queued_due, load.queued_banked, strict=True):
                (ahead if p > priority or (p == priority and (d <= due or (first and b))) else behind).append(n)
        need = sum(blocks_for(n + 1, load.block_size) for n in (*ahead, num_prompt_tokens))
        slots = load.num_running + len(ahead) + 1 - load.max_num_seqs if load.max_num_seqs else 0
        if steps.mixes and load.num_running:  # chunked prefill: one step prefills them beside the decodes
            prefill = steps.mixed_s((*ahead, num_prompt_tokens), load.num_running, load.num_context_tokens)
        else:
            seats = -slots if load.max_num_seqs else len(behind)
            join = joining(behind, load.num_free_blocks - need, seats, load.block_size) if objective_s else []
            prefill = steps.prefill_s((num_prompt_tokens, *join)) + sum(steps.prefill_s((n,)) for n in ahead)
        deficit = need - load.num_free_blocks
        wait = self.memory_wait(load, deficit, step, slots)
        if wait > 0.0 and load.runners and due is not None and objective_s is not None:
            wait = min(wait, preempt_wait(load, deficit, slots, priority, due, objective_s))
        return step / 2 + wait + prefill

    def ttft_queued(self, load: InstanceLoad, index: int) -> float:
        """What is left of the wait of the request queued ``index``-th on ``load``, to its first token."""
        priority, tokens = load.queued[index]
        ahead = load.queued[:index]
        return self.ttft(replace(load, queued=ahead, queued_due=load.queued_due[:index],
                                 queued_banked=load.queued_banked[:index]), tokens, priority)

    def memory_wait(self, load: InstanceLoad, deficit: int, step_s: float, slots: int = 0) -> float:
        """Until the running requests expected to end first have freed ``deficit`` blocks
        and ``slots`` places in the batch."""
        if deficit <= 0 and slots <= 0:
            return 0.0
        freed = 0
        for k, (remaining, blocks) in enumerate(load.release, 1):
            freed += blocks
            if freed >= deficit and k >= slots:
                return remaining * step_s
        last = load.release[-1][0] if load.release else self.lengths.mean
        return 2 * last * max(step_s, load.steps.decode_s(1, 1))  # more than all it runs: a long wait

    def tpot(self, load: InstanceLoad, num_prompt_tokens: int, now: float, *, expected: bool = False) -> float:
        """TPOT of a request joining ``load`` (and, the same, of those already there after it
        joins), with every queued request in its batch: what dispatch scores (the queue joins
        the batch in time). ``expected``: with the queued requests the memory left after it
        admits only (``tpot_now``'s batch with it in), what a shed decision reads. Dispatch by
        the expected TPOT lowered goal.yaml's goodput from 204 to 188 req/s (seeds 0-4) and its
        interactive attainment from 0.963 to 0.944 over the sweep; shedding by the whole
        queue's TPOT refused batch requests that all would have met (benchmarks/slo/README.md)."""
        if expected:
            need = blocks_for(num_prompt_tokens + 1, load.block_size)
            ctx = load.num_context_tokens + num_prompt_tokens + int(self.lengths.mean / 2)
            return self.tpot_now(replace(load, num_running=load.num_running + 1, num_context_tokens=ctx,
                                         num_free_blocks=load.num_free_blocks - need), now)
        batch = load.num_running + len(load.queued) + len(load.overdue) + 1
        ctx = (load.num_context_tokens + sum(n for _, n in load.queued) + sum(n for _, n in load.overdue)
               + num_prompt_tokens)
        ctx += int(self.lengths.mean / 2)  # its context grows by half its output on average
        return load.steps.decode_s(batch, ctx) / (1.0 - self.prefill_share(now))

    def tpot_now(self, load: InstanceLoad, now: float) -> float:
        """TPOT of the requests running on ``load`` as it is (no newcomer): the decode step of
        the batch that can form, the running requests and the queued ones (in service order,
        the overdue last) that the free memory admits. A queue that memory holds back does
        not join the batch: counted in it, every instance with a queue looked past its TPOT
        objective and rescue moved running requests off instances on pace (issue 47, helper
        slo5: at 40 req/s on the goal's seed 0, all 240 TPOT rescue orders)."""
        if not load.num_running:
            return 0.0
        free, batch, ctx = load.num_free_blocks, load.num_running, load.num_context_tokens
        for _, tokens in (*load.queued, *load.overdue):
            need = blocks_for(tokens + 1, load.block_size)
            if need > free:
                break
            free -= need
            batch += 1
            ctx += tokens
        return load.steps.decode_s(batch, ctx) / (1.0 - self.prefill_share(now))
