"""Virtual usage and freeness (the paper's Algorithm 1).

    virtual_usage(req):
        queued, head of line      -> its block demand          (de-fragmentation)
        queued, not head of line  -> 0
        fake (instance terminating) -> +inf                     (drain for scale-in)
        running                   -> physical blocks + headroom(priority) / #running of that priority
    freeness = (M - sum V) / B        M = total blocks, B = batch size (running requests)

An idle instance (B = 0) divides by 1: its freeness is its free capacity in
blocks, higher than any busy instance with the same free space.
"""
from __future__ import annotations

import math
from collections import Counter

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig


def headroom_blocks(cfg: FreenessConfig, priority: int, block_size: int) -> float:
    return -(-cfg.headroom_tokens.get(priority, 0) // block_size)


def virtual_usages(status: InstanceStatus, cfg: FreenessConfig) -> list[float]:
    """V of every request on the instance (running, then queued, then the fake one)."""
    per_priority = Counter(r.priority for r in status.running)
    out = []
    for r in status.running:
        out.append(r.num_blocks + headroom_blocks(cfg, r.priority, status.block_size) / per_priority[r.priority])
    if status.waiting:
        out.append(float(status.head_of_line_demand))
        out.extend(0.0 for _ in status.waiting[1:])
    if status.is_terminating:
        out.append(math.inf)
    return out


def total_virtual_usage(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """Sum of V, counting blocks held for incoming migrations as used."""
    return sum(virtual_usages(status, cfg)) + status.num_reserved_blocks


def freeness(status: InstanceStatus, cfg: FreenessConfig) -> float:
    batch = max(1, len(status.running))
    return (status.num_total_blocks - total_virtual_usage(status, cfg)) / batch


def normal_freeness(status: InstanceStatus, cfg: FreenessConfig) -> float:
    """Freeness of the normal-priority load alone (no headroom): what auto-scaling watches."""
    return freeness(status, FreenessConfig(headroom_tokens={}))


def memory_load(status: InstanceStatus) -> float:
    """INFaaS++'s load: used blocks plus the demand of every queued request, as a fraction."""
    queued = sum(-(-r.num_tokens // status.block_size) for r in status.waiting)
    return (status.num_used_blocks + queued) / status.num_total_blocks
