"""The built-in filters, scorers and pickers."""
from __future__ import annotations

from llumnix.core.status import InstanceStatus
from llumnix.policy.decode_shield import shield_pick
from llumnix.policy.freeness import freeness, memory_load, queue_aware_freeness
from llumnix.policy.pipeline import (
    FILTERS,
    PICKERS,
    SCORERS,
    DispatchContext,
    register,
    register_key,
)
from llumnix.policy.prefix_affinity import affinity_pick
from llumnix.policy.slo_dispatch import slo_scores


@register(FILTERS, "schedulable")
def schedulable(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return s.is_schedulable


@register(FILTERS, "not-terminating")
def not_terminating(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return not s.is_terminating


@register(FILTERS, "fresh")
def fresh(s: InstanceStatus, ctx: DispatchContext) -> bool:
    return ctx.now - s.timestamp <= ctx.staleness_s


@register_key("freeness", higher_is_better=True)
def freeness_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """Llumnix: the freest candidate scores 1, the least free 0 (min-max over candidates)."""
    return freeness(s, ctx.freeness)


@register_key("queue-aware-freeness", higher_is_better=True)
def queue_aware_freeness_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """Freeness with every queued request counted (``freeness.queue_aware_freeness``)."""
    return queue_aware_freeness(s, ctx.freeness)


@register_key("memory-load", higher_is_better=False)
def memory_load_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """INFaaS++: the lowest memory load counting all queued demand scores 1."""
    return memory_load(s)


@register_key("fewest-sent", higher_is_better=False, per_status=False)
def fewest_sent_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """Round-robin: the instance sent the fewest requests so far (``ctx.sent``) scores 1."""
    return float(ctx.sent.get(s.instance_id, 0))


@register_key("fewest-requests", higher_is_better=False)
def fewest_requests_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """Least-requests: running plus queued (plus pending, in the scheduler's view)."""
    return float(s.num_running + s.num_waiting)


@register_key("queue-depth", higher_is_better=False)
def queue_depth_key(s: InstanceStatus, ctx: DispatchContext) -> float:
    """llm-d's queue scorer: the shortest queue scores 1, the longest 0."""
    return float(s.num_waiting)


@register(SCORERS, "kv-utilization")
def kv_utilization(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """llm-d's KV-cache scorer: 1 - used fraction (absolute, not relative)."""
    return [1.0 - s.num_used_blocks / max(1, s.num_total_blocks) for s in cands]


@register(SCORERS, "prefix-match")
def prefix_match(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """llm-d's prefix-cache scorer: the fraction of the prompt whose blocks were sent to the
    instance before (``PrefixIndex``; absolute, not relative). 0 everywhere without tokens."""
    hits, n = ctx.prefix_hits, ctx.num_prompt_tokens
    if not hits or not n:
        return [0.0] * len(cands)
    return [min(1.0, hits.get(s.instance_id, 0) * s.block_size / n) for s in cands]


@register(SCORERS, "predicted-slo")
def predicted_slo(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """Where the request meets its SLO class's objectives with the most slack, without
    pushing the requests already there past theirs (``policy/slo_dispatch.py``; absolute:
    >= 0.5 meets, below misses, the least-bad highest)."""
    return slo_scores(cands, ctx.slo, ctx.now)


@register(SCORERS, "predicted-slo-freeness")
def predicted_slo_freeness(cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
    """``predicted-slo``, the candidates that meet the objectives ranked by queue-aware freeness."""
    return slo_scores(cands, ctx.slo, ctx.now, ctx.freeness)


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


@register(PICKERS, "decode-shield")
def decode_shield(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    """Not the paper's: a long prompt goes where its prefill stalls the fewest young
    decoding requests, among the near-best scores (``policy/decode_shield.py``)."""
    return shield_pick(cands, scores, ctx.num_prompt_tokens)


@register(PICKERS, "prefix-affinity")
def prefix_affinity(cands: list[InstanceStatus], scores: list[float], ctx: DispatchContext) -> InstanceStatus:
    """Not the paper's: among the candidates with at most a few more requests than the
    freest, the one the longest prefix of the prompt was sent to before
    (``policy/prefix_affinity.py``)."""
    return affinity_pick(cands, scores, ctx.prefix_hits, ctx.prefix_options)
