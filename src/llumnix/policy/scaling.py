"""Auto-scaling: keep the average normal-priority freeness within [x, y].

Over the last ``window_s`` of (time, average freeness) samples: below x add an
instance; above y drain the active instance with the fewest running requests
(ties: fewest queued, then lowest id). No decision before a full window has
been observed, during the cooldown after an action, or while an instance
ordered by an earlier scale-out is still starting (its effect is not visible
yet). Bounds: every instance that exists (starting, serving or draining)
counts toward ``max_instances``; only active (not terminating) ones toward
``min_instances``. The decision is pure; marking the victim terminating and
starting the new instance are the caller's.
"""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import ScalingConfig


@dataclass(frozen=True)
class ScaleAction:
    kind: str
    """none | out | in."""
    instance_id: str | None = None
    """The instance to drain, for ``in``."""
    reason: str = ""


NO_ACTION = ScaleAction("none")


def scale_in_victim(statuses: list[InstanceStatus]) -> str | None:
    """The active instance with the fewest running requests."""
    active = [s for s in statuses if not s.is_terminating]
    if not active:
        return None
    return min(active, key=lambda s: (s.num_running, s.num_waiting, s.instance_id)).instance_id


def scaling_decision(samples: list[tuple[float, float]], statuses: list[InstanceStatus],
                     cfg: ScalingConfig, now: float, last_action_time: float | None,
                     num_starting: int = 0) -> ScaleAction:
    """``samples``: (time, average normal freeness) observations, oldest first;
    ``num_starting``: instances ordered by scale-out that have not reported yet."""
    if not cfg.enabled or num_starting > 0:
        return NO_ACTION
    if last_action_time is not None and now - last_action_time < cfg.cooldown_s:
        return NO_ACTION
    if not samples or now - samples[0][0] < cfg.window_s:
        return NO_ACTION  # not a full window of evidence yet
    window = [f for t, f in samples if now - t <= cfg.window_s]
    if not window:
        return NO_ACTION
    avg = sum(window) / len(window)
    num_active = sum(1 for s in statuses if not s.is_terminating)
    if avg < cfg.scale_out_below and len(statuses) < cfg.max_instances:
        return ScaleAction("out", reason=f"average freeness {avg:.1f} < {cfg.scale_out_below}")
    if avg > cfg.scale_in_above and num_active > cfg.min_instances:
        return ScaleAction("in", scale_in_victim(statuses),
                           f"average freeness {avg:.1f} > {cfg.scale_in_above}")
    return NO_ACTION
