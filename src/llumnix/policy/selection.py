"""Which requests a migration source gives up.

paper: lower priority first, then shorter sequences (cheapest to move, and the
  pause they see is short), running and queued alike;
SR / LR: shortest / longest running request; FCW: first-come waiting request.
A high-priority request is never chosen while a normal one is available,
and a request already migrating is never chosen again.
"""
from __future__ import annotations

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy.config import PolicyConfigError

SELECTIONS = ("paper", "SR", "LR", "FCW")


def select_requests(status: InstanceStatus, policy: str = "paper", max_n: int = 1,
                    exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:
    running = [r for r in status.running if not r.is_migrating and r.request_id not in exclude]
    waiting = [r for r in status.waiting if r.request_id not in exclude]
    pool: list[RequestBrief]
    if policy == "paper":
        pool = sorted(running + waiting, key=lambda r: (r.priority, r.num_tokens, r.arrival_time))
    elif policy == "SR":
        pool = sorted(running, key=lambda r: (r.priority, r.num_tokens, r.arrival_time))
    elif policy == "LR":
        pool = sorted(running, key=lambda r: (r.priority, -r.num_tokens, r.arrival_time))
    elif policy == "FCW":
        pool = sorted(waiting, key=lambda r: (r.priority, r.arrival_time))
    else:
        raise PolicyConfigError(f"unknown selection policy {policy!r} (known: {', '.join(SELECTIONS)})",
                                "rescheduling.selection")
    return [r.request_id for r in pool[:max_n]]
