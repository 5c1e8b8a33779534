"""Head-of-line de-fragmentation (``rescheduling.defrag: hol``): plan room for the
blocked head-of-line request instead of only counting its demand. Not in the paper.

Algorithm 1 counts a queued head-of-line (HOL) request's demand in its instance's
virtual usage, so a *blocked* instance (HOL demand above its free blocks) becomes a
migration source. But the paper then moves the source's shortest request (often a
short one queued behind the HOL, which unblocks nothing) to a destination chosen by
freeness alone, and on a loaded cluster with large batches no instance is above the
threshold even while there is room for the HOL elsewhere. This plans the move that
unblocks the queue: the HOL itself (queued, so it moves as metadata) goes to the
instance where it fits now with the most room left.

    blocked:  waiting and HOL demand > free blocks - watermark
    fits(d):  d has no queue, and after admitting the HOL it keeps
              free - watermark - demand >= out_threshold * (running + 1)
              (its physical freeness stays at or above the migrate-out threshold,
              so the move cannot turn the destination into a source)

Blocked instances are served oldest HOL first; each destination takes one HOL per
round. The paper's pairing then runs over the instances not used here.
"""
from __future__ import annotations

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import ReschedulingConfig
from llumnix.policy.freeness import head_of_line_demand


def is_blocked(status: InstanceStatus) -> bool:
    """The head-of-line queued request does not fit in the free blocks."""
    if not status.waiting:
        return False
    return head_of_line_demand(status) > status.num_free_blocks - status.num_watermark_blocks


def room_after(status: InstanceStatus, demand: int, cfg: ReschedulingConfig) -> float | None:
    """Free blocks per request ``status`` keeps after admitting ``demand`` more blocks,
    or None when it cannot take them with the margin (see the module docstring)."""
    if status.waiting or not status.is_schedulable or status.is_terminating:
        return None
    if status.num_migrating_in >= cfg.max_in:
        return None
    left = status.num_free_blocks - status.num_watermark_blocks - demand
    per_request = left / (status.num_running + 1)
    return per_request if per_request >= cfg.out_threshold else None


def _movable_hol(status: InstanceStatus) -> bool:
    return bool(status.waiting) and not status.waiting[0].is_migrating


def plan_hol_moves(statuses: list[InstanceStatus], cfg: ReschedulingConfig) -> list[tuple[str, str]]:
    """(blocked source, destination with room for its HOL) pairs, one per instance."""
    blocked = sorted((s for s in statuses if is_blocked(s) and _movable_hol(s)
                      and s.num_migrating_out < cfg.max_out and not s.is_terminating),
                     key=lambda s: (s.waiting[0].arrival_time, s.instance_id))
    taken: set[str] = set()
    moves = []
    for src in blocked:
        demand = head_of_line_demand(src)
        best: tuple[float, str] | None = None
        for dst in statuses:
            if dst.instance_id == src.instance_id or dst.instance_id in taken:
                continue
            room = room_after(dst, demand, cfg)
            if room is not None and (best is None or (-room, dst.instance_id) < best):
                best = (-room, dst.instance_id)
        if best is not None:
            taken.update((src.instance_id, best[1]))
            moves.append((src.instance_id, best[1]))
    return moves
