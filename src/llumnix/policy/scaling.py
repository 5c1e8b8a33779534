"""Auto-scaling: keep the average normal-priority freeness within [x, y]."""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import ScalingConfig


@dataclass(frozen=True)
class ScaleAction:
    kind: str  # "none" | "out" | "in"
    instance_id: str | None = None
    reason: str = ""


NO_ACTION = ScaleAction("none")


def scaling_decision(samples: list[tuple[float, float]], statuses: list[InstanceStatus],
                     cfg: ScalingConfig, now: float, last_action_time: float | None) -> ScaleAction:
    """``samples``: (time, average normal freeness) observations, oldest first."""
    if not cfg.enabled:
        return NO_ACTION
    if last_action_time is not None and now - last_action_time < cfg.cooldown_s:
        return NO_ACTION
    window = [f for t, f in samples if now - t <= cfg.window_s]
    if not window or (samples and now - samples[0][0] < cfg.window_s):
        return NO_ACTION  # not a full window of evidence yet
    avg = sum(window) / len(window)
    active = [s for s in statuses if not s.is_terminating]
    if avg < cfg.scale_out_below and len(active) < cfg.max_instances:
        return ScaleAction("out", reason=f"average freeness {avg:.1f} < {cfg.scale_out_below}")
    if avg > cfg.scale_in_above and len(active) > cfg.min_instances:
        victim = min(active, key=lambda s: (s.num_running + s.num_waiting, s.instance_id))
        return ScaleAction("in", victim.instance_id, f"average freeness {avg:.1f} > {cfg.scale_in_above}")
    return NO_ACTION
