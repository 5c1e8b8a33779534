"""Which requests a migration source gives up.

paper (default): lower priority first, then shorter sequences (cheapest to move,
  and the pause they see is short), running and queued alike;
SR / LR: shortest / longest running request;
FCW: first-come waiting (queued) request;
freed (not the paper's): lower priority first, then the fewest blocks moved per block
  the move frees on the source, then shorter. With prefix caching a request's leading
  blocks may be shared with other requests on the source: they move (unless the
  destination caches them) but stay held there, so a short request on a popular prefix
  frees little for what it costs. Without sharing every ratio is 1: the paper's order.

Two rules hold for every policy: a request already migrating (flagged in the
snapshot or passed in ``exclude``) is never chosen, and only requests of the
lowest priority present among the movable ones are candidates, so a
high-priority request is never chosen while a normal one is available
(under SR/LR/FCW this can mean choosing nothing: e.g. SR on an instance whose
only normal requests are queued).

``hol_first`` (``rescheduling.defrag: hol``, not the paper's): on a blocked instance
the head-of-line queued request goes first, whatever its priority or length, since
moving it is what unblocks the queue (``policy/defrag.py``).

``dst_room`` (``rescheduling.queued_moves: fits``, not the paper's): the blocks the
destination has for a request joining its queue (``freeness.room_for_queued``); a queued
request that needs more is not a candidate, since it would only queue again there.

``dst_free``: the blocks the destination can reserve for a running request
(``freeness.room_for_migration``); a running request holding more is not a candidate,
since the destination would refuse its reservation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy.config import SELECTIONS, PolicyConfigError
from llumnix.policy.defrag import is_blocked
from llumnix.policy.freeness import blocks_for

__all__ = ["SELECTIONS", "movable_requests", "select_requests"]

# policy -> (which pool, sort key within the lowest priority)
_POLICIES: dict[str, tuple[str, Callable[[RequestBrief], tuple[Any, ...]]]] = {
    "paper": ("both", lambda r: (r.num_tokens, r.arrival_time, r.request_id)),
    "SR": ("running", lambda r: (r.num_tokens, r.arrival_time, r.request_id)),
    "LR": ("running", lambda r: (-r.num_tokens, r.arrival_time, r.request_id)),
    "FCW": ("waiting", lambda r: (r.arrival_time, r.request_id)),
    "freed": ("both", lambda r: (r.num_tokens, r.arrival_time, r.request_id)),  # after the ratio
}


def movable_requests(status: InstanceStatus, exclude: Collection[str] = frozenset()) -> list[RequestBrief]:
    """Running and queued requests not already migrating."""
    return [r for r in (*status.running, *status.waiting)
            if not r.is_migrating and r.request_id not in exclude]


def select_requests(status: InstanceStatus, policy: str = "paper", max_n: int = 1,
                    exclude: Collection[str] = frozenset(), hol_first: bool = False,
                    dst_room: int | None = None, shared: Mapping[str, int] | None = None,
                    dst_free: int | None = None) -> list[str]:
    """Up to ``max_n`` request ids to migrate out of ``status``, best first. ``shared``
    (policy ``freed``): request id -> blocks of its table other requests hold too."""
    if dst_room is not None:
        exclude = {*exclude, *(r.request_id for r in status.waiting
                               if blocks_for(r.num_tokens, status.block_size) > dst_room)}
    if dst_free is not None:
        exclude = {*exclude, *(r.request_id for r in status.running if r.num_blocks > dst_free)}
    if hol_first and is_blocked(status):
        hol = status.waiting[0]
        if not hol.is_migrating and hol.request_id not in exclude:
            rest = select_requests(status, policy, max_n - 1, (*exclude, hol.request_id),
                                   shared=shared, dst_free=dst_free) if max_n > 1 else []
            return [hol.request_id, *rest]
    if policy not in _POLICIES:
        raise PolicyConfigError(f"unknown selection policy {policy!r} (known: {', '.join(SELECTIONS)})",
                                "rescheduling.selection")
    movable = movable_requests(status, exclude)
    if not movable:
        return []
    floor = min(r.priority for r in movable)
    pool_name, key = _POLICIES[policy]
    if pool_name != "both":
        allowed = {r.request_id for r in (status.running if pool_name == "running" else status.waiting)}
        movable = [r for r in movable if r.request_id in allowed]
    pool = [r for r in movable if r.priority == floor]
    if policy == "freed":
        held = shared or {}
        bs = status.block_size

        def moved_per_freed(r: RequestBrief) -> float:
            n = r.num_blocks or blocks_for(r.num_tokens, bs)  # queued: what it will take
            freed = n - held.get(r.request_id, 0)
            return n / freed if freed > 0 else math.inf

        return [r.request_id for r in sorted(pool, key=lambda r: (moved_per_freed(r), *key(r)))[:max_n]]
    return [r.request_id for r in sorted(pool, key=key)[:max_n]]
