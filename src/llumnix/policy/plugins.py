"""The built-in filters, scorers and pickers."""
from __future__ import annotations

from llumnix.core.status import InstanceStatus
from llumnix.policy.freeness import freeness, memory_load, queue_aware_freeness
from llumnix.policy.pipeline import (
    FILTERS,
    PICKERS,
    SCORERS,
    DispatchContext,
    higher_is_better,
    lower_is_better,
    register,
)


@register(FILTERS, "schedulable")
def schedulable(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return s.is_schedulable


@register(FILTERS, "not-terminating")
def not_terminating(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return not s.is_terminating


@register(FILTERS, "fresh")
def fresh(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return ctx.now - s.timestamp <= ctx.staleness_s


@register(SCORERS, "freeness")
def freeness_score(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """Llumnix: 1 for the freest candidate, 0 for the least free (min-max over candidates)."""
    cfg = ctx.freeness

    def metric(s: InstanceStatus) -> float:
        return freeness(s, cfg)

    return higher_is_better([ctx.metric("freeness", s, metric) for s in cands])


@register(SCORERS, "queue-aware-freeness")
def queue_aware_freeness_score(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """Freeness with every queued request counted (``freeness.queue_aware_freeness``)."""
    cfg = ctx.freeness

    def metric(s: InstanceStatus) -> float:
        return queue_aware_freeness(s, cfg)

    return higher_is_better([ctx.metric("queue-aware-freeness", s, metric) for s in cands])


@register(SCORERS, "memory-load")
def memory_load_score(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """INFaaS++: 1 for the lowest memory load counting all queued demand."""
    return lower_is_better([ctx.metric("memory-load", s, memory_load) for s in cands])


@register(SCORERS, "fewest-sent")
def fewest_sent(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """Round-robin: 1 for the instance sent the fewest requests so far (``ctx.sent``)."""
    return lower_is_better([float(ctx.sent.get(s.instance_id, 0)) for s in cands])


@register(SCORERS, "fewest-requests")
def fewest_requests(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """Least-requests: running plus queued (plus pending, in the scheduler's view)."""
    return lower_is_better([float(s.num_running + s.num_waiting) for s in cands])


@register(SCORERS, "queue-depth")
def queue_depth(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """llm-d's queue scorer: 1 for the shortest queue, 0 for the longest."""
    return lower_is_better([float(s.num_waiting) for s in cands])


@register(SCORERS, "kv-utilization")
def kv_utilization(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """llm-d's KV-cache scorer: 1 - used fraction (absolute, not relative)."""
    return [1.0 - s.num_used_blocks / max(1, s.num_total_blocks) for s in cands]


@register(PICKERS, "max-score")
def max_score(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    best = max(scores)
    return next(s for s, v in zip(cands, scores, strict=True) if v == best)  # ties: lowest id


@register(PICKERS, "max-score-random")
def max_score_random(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    best = max(scores)
    return ctx.rng.choice([s for s, v in zip(cands, scores, strict=True) if v == best])


@register(PICKERS, "random")
def random_pick(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    return ctx.rng.choice(cands)


@register(PICKERS, "power-of-two")
def power_of_two(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    if len(cands) == 1:
        return cands[0]
    i, j = ctx.rng.sample(range(len(cands)), 2)
    return cands[i] if scores[i] >= scores[j] else cands[j]
