"""Virtual usage and freeness (the paper's Algorithm 1).

    virtual_usage(req):
        queued, head of line        -> its block demand                   (de-fragmentation)
        queued, not head of line    -> 0
        fake (instance terminating) -> +inf                                (drain for scale-in)
        running                     -> physical blocks + headroom(priority) / #running of that priority
    freeness F = (M - sum V) / B      M = total blocks, B = batch size (running requests)

F is in blocks per running request: how many more decode steps the batch can
take before it runs out of KV. Past full (M - sum V < 0, e.g. a burst's prompts counted
before any of them ran) dividing by B would rank the more crowded instance freer
(-10 / 10 > -6 / 4), so an overdrawn instance's deficit is multiplied by B instead
(``per_request``): F keeps falling as requests join, on both sides of 0. An idle instance (B = 0) divides by 1, so its
freeness is its whole free capacity in blocks: higher than any busy instance
with the same free space. Blocks reserved for incoming migrations are not
attached to any request here, so they are added to sum V.
"""
from __future__ import annotations

import math
from collections import Counter

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


def headroom_blocks(cfg: FreenessConfig, priority: int, block_size: int) -> float:
    """Blocks held in reserve for all of one priority's requests on an instance."""
    return blocks_for(cfg.headroom_tokens.get(priority, 0), block_size)


def head_of_line_demand(status: InstanceStatus) -> int:
    """Blocks the head-of-line queued request needs (0 with an empty queue).

    Engines report it; a snapshot that leaves it 0 with a non-empty queue gets
    the demand of the first queued request's tokens."""
    if not status.waiting:
        return 0
    if status.head_of_line_demand > 0:
        return status.head_of_line_demand
    return blocks_for(status.waiting[0].num_tokens, status.block_size)


def _running_usages(status: InstanceStatus, cfg: FreenessConfig) -> list[float]:
    """V of each running request: its blocks plus its share of its priority's headroom."""
    per_priority = Counter(r.priority for r in status.running)
    share = {p: headroom_blocks(cfg, p, status.block_size) / n for p, n in per_priority.items()}
    return [r.num_blocks + share[r.priority] for r in status.running]


def _other_usages(status: InstanceStatus, fake: bool) -> list[float]:
    """V of the queued requests (the head of line's demand, then zeros) and of the fake
    one (only when ``fake`` and the instance is terminating)."""
    out: list[float] = []
    if status.waiting:
        out.append(float(head_of_line_demand(status)))
        out.extend(0.0 for _ in status.waiting[1:])
    if fake and status.is_terminating:
        out.append(math.inf)
    return out


def virtual_usages(status: InstanceStatus, cfg: FreenessConfig, *, fake: bool = True) -> list[float]:
    """V of every request on the instance: running, then queued, then the fake one
    (only when ``fake`` and the instance is terminating)."""
    return _running_usages(status, cfg) + _other_usages(status, fake)


def total_virtual_usage(status: InstanceStatus, cfg: FreenessConfig, *, fake: bool = True) -> float:
    """Sum of V, counting blocks held for incoming migrations as used and each block that
    running requests share (prefix caching) once. The queued requests' V summed without
    their list (``_other_usages``: the head of line's demand, zeros, the fake one), in the
    same order: every pairing round reads it for every instance."""
    usage = _running_usage(status, cfg)
    if status.waiting:
        usage += float(head_of_line_demand(status))
    if fake and status.is_terminating:
        usage += math.inf
    return usage + status.num_reserved_blocks - status.num_shared_block_holds


def _running_usage(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """Sum of the running requests' V. The hot path of every status report and dispatch:
    when no running request's priority carries headroom, V is their physical blocks, and
    the sum needs neither the per-priority shares nor the list (integers: the same value
    exactly as summing ``_running_usages``)."""
    running = status.running
    priorities = cfg.headroom_priorities  # those whose headroom_blocks are more than 0, at any block size
    if priorities and not priorities.isdisjoint({r.priority for r in running}):
        return sum(_running_usages(status, cfg))
    return float(sum([r.num_blocks for r in running]))


def per_request(free: float, num_requests: int) -> float:
    """Free blocks per request, ``free / n``; a deficit (``free < 0``) times ``n``, so that
    more requests never make an instance look freer (n = 0 counts as 1)."""
    n = max(1, num_requests)
    return free / n if free >= 0 else free * n


def freeness(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """F = (M - sum V) / max(B, 1); -inf for a terminating instance. ``freeness_after``
    with nothing joining, its sum written out (every pairing round reads it for every
    instance): the same operations in the same order, less the ``- 0``."""
    usage = _running_usage(status, cfg)
    if status.waiting:
        usage += float(head_of_line_demand(status))
    if status.is_terminating:
        usage += math.inf
    return per_request(status.num_total_blocks - (usage + status.num_reserved_blocks - status.num_shared_block_holds),
                       len(status.running))


def freeness_after(status: InstanceStatus, cfg: FreenessConfig, blocks: float, requests: int = 1) -> float:
    """F once ``requests`` more running requests holding ``blocks`` more blocks join the
    instance (a migration's destination, judged before the move)."""
    return per_request(status.num_total_blocks - total_virtual_usage(status, cfg) - blocks, status.num_running + requests)


def queue_aware_freeness(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """Freeness with *every* queued request counting its demand and a batch slot:
    (M - sum V_running - sum demand_queued) / max(B + #queued, 1). Not Algorithm 1 (where
    only the head of line counts, for de-fragmentation); it is the dispatch load of the
    open-source Llumnix, which keeps new requests off instances with a queue. Offered as
    the ``llumnix`` dispatch option ``queued: all``; -inf for a terminating instance."""
    usage = _running_usage(status, cfg) + (math.inf if status.is_terminating else 0) + _queued_demand(status)
    usage += status.num_reserved_blocks - status.num_shared_block_holds
    # the counts as len(), not InstanceStatus's properties: every dispatch key reads them
    return per_request(status.num_total_blocks - usage, len(status.running) + len(status.waiting))


def _queued_demand(status: InstanceStatus) -> int:
    """Blocks every queued request needs to start (``blocks_for`` of each, inlined: every
    dispatch key reads the whole queue)."""
    bs = status.block_size
    return sum([-(-r.num_tokens // bs) for r in status.waiting])


def room_for_queued(status: InstanceStatus) -> int:
    """Blocks a request joining the instance's queue could have at the next step: the free
    blocks beyond the watermark and beyond what every request already queued needs to start
    (FCFS admits those first); 0 when there are none."""
    return max(0, status.num_free_blocks - status.num_watermark_blocks - _queued_demand(status))


MIGRATION_GROWTH_BLOCKS = 1
"""Blocks a migrating request may add while its earlier stages are copied (it keeps
decoding; the last stage moves at most ``last_stage_max_blocks``, and each stage reserves
what the request grew by): a destination must have them free beyond its own blocks."""


def room_for_migration(status: InstanceStatus, queued: bool = False) -> int:
    """Blocks a running request migrating in may hold and still be reserved here through
    its last stage: free beyond the watermark, less ``MIGRATION_GROWTH_BLOCKS``; >= 0.
    ``queued``: beyond what every request already queued here needs to start, too (the
    blocks its queue is about to take; ``rescheduling.dst_queue: all``)."""
    owed = _queued_demand(status) if queued else 0
    return max(0, status.num_free_blocks - status.num_watermark_blocks - MIGRATION_GROWTH_BLOCKS - owed)


def fits_now(status: InstanceStatus, num_prompt_tokens: int) -> bool:
    """A prompt of this length can be admitted at the instance's next step."""
    return room_for_queued(status) >= blocks_for(num_prompt_tokens, status.block_size)


def normal_freeness(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """Freeness as normal-priority load sees it, what auto-scaling watches: the headroom of
    higher priorities stays reserved (normal requests cannot use it), but a terminating
    instance's fake request is left out, so the value stays finite."""
    used = total_virtual_usage(status, cfg, fake=False)
    return (status.num_total_blocks - used) / max(1, status.num_running)


def average_normal_freeness(statuses: list[InstanceStatus], cfg: FreenessConfig,
                            signal: str = "cluster") -> float | None:
    """The average normal-priority freeness of the active instances (schedulable, not
    terminating) that auto-scaling watches; None when there are none.

    ``mean``: the mean of each instance's ``normal_freeness`` (the paper's words, "the
    average freeness"). An idle instance counts its whole capacity (B = 0 divides by 1),
    so one idle instance among n lifts the mean by M/n: the signal jumps whenever an
    instance empties, whatever the load on the rest.
    ``cluster``: the freeness of the summed cluster, (sum M - sum V) / max(1, sum B),
    i.e. free blocks per running request over the whole cluster (the open-source
    Llumnix's ``avg_load``). It moves with the load, not with how it is spread.
    ``demand``: the summed cluster with *every* queued request counting its block demand
    and a batch slot, (sum M - sum V_running - sum demand_queued) / max(1, sum B + sum
    queued). Algorithm 1 counts only a queue's head of line (for de-fragmentation), so
    with ``cluster`` a growing queue hardly lowers the signal; with ``demand`` the load
    a queue is waiting to bring counts as load, and a queue calls for scale-out."""
    live = [s for s in statuses if s.is_schedulable and not s.is_terminating]
    if not live:
        return None
    if signal == "cluster":
        free = sum(s.num_total_blocks - total_virtual_usage(s, cfg, fake=False) for s in live)
        return free / max(1, sum(s.num_running for s in live))
    if signal == "demand":
        # Algorithm 1's usage counts the head of line's demand; every queued request's replaces it.
        free = sum(s.num_total_blocks - total_virtual_usage(s, cfg, fake=False) + head_of_line_demand(s)
                   - _queued_demand(s) for s in live)
        return free / max(1, sum(s.num_running + s.num_waiting for s in live))
    return sum(normal_freeness(s, cfg) for s in live) / len(live)


def memory_load(status: InstanceStatus) -> float:
    """INFaaS++'s load: used blocks plus the demand of *every* queued request, over total
    blocks. Unlike freeness: no priority headroom, no division by the batch size, and the
    whole queue counts, not only its head."""
    return (status.num_used_blocks + _queued_demand(status)) / status.num_total_blocks
