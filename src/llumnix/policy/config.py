"""Frozen configuration of the scheduling policies, buildable from YAML dicts."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llumnix.core.errors import InvalidRequestError

T = TypeVar("T")


class PolicyConfigError(InvalidRequestError):
    """A policy configuration names an unknown field or policy, or a bad value."""


def from_dict(cls: type[T], d: dict[str, Any] | None, where: str = "") -> T:
    """Build a config dataclass from a dict; unknown keys are an error naming the field."""
    d = dict(d or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names)
    if unknown:
        raise PolicyConfigError(f"unknown field '{where}{unknown[0]}' (known: {', '.join(sorted(names))})",
                                unknown[0])
    try:
        return cls(**d)
    except TypeError as e:
        raise PolicyConfigError(f"{where.rstrip('.') or cls.__name__}: {e}") from e


@dataclass(frozen=True)
class FreenessConfig:
    headroom_tokens: dict[int, int] = field(default_factory=lambda: {1: 1600, 0: 0})
    """Per priority level: tokens of KV kept in reserve for its requests on an instance,
    shared among them (execution priority). Default: high = 1600, normal = 0."""

    def __post_init__(self) -> None:
        if any(v < 0 for v in self.headroom_tokens.values()):
            raise PolicyConfigError("headroom_tokens must be >= 0", "headroom_tokens")


DISPATCH_POLICIES = ("llumnix", "infaas++", "round-robin", "least-requests", "random", "power-of-two",
                     "llm-d", "custom")


@dataclass(frozen=True)
class DispatchConfig:
    policy: str = "llumnix"
    """llumnix | infaas++ | round-robin | random | least-requests | power-of-two | llm-d."""
    params: dict[str, Any] = field(default_factory=dict)
    """Policy-specific parameters (weights of the llm-d scorer, ...)."""
    staleness_s: float = 2.0
    """Statuses older than this are not dispatched to (unless every one is stale)."""
    pending_grace_s: float = 0.0
    """How long a dispatched request may take to show up in its instance's reports
    (0 in the simulator, where delivery is instant; about a second over Ray)."""

    def __post_init__(self) -> None:
        if self.policy not in DISPATCH_POLICIES:
            raise PolicyConfigError(f"unknown dispatch policy {self.policy!r} "
                                    f"(known: {', '.join(DISPATCH_POLICIES)})", "dispatch.policy")
        if self.staleness_s <= 0:
            raise PolicyConfigError("staleness_s must be > 0", "staleness_s")


@dataclass(frozen=True)
class ReschedulingConfig:
    enabled: bool = True
    """Run migration rounds at all (off for the round-robin and INFaaS++ baselines)."""
    out_threshold: float = 3.0
    """Instances with freeness below this are migration sources."""
    in_threshold: float = 3.0
    """Instances with freeness above this can be destinations."""
    max_out: int = 1
    """Concurrent migrations out of one instance."""
    max_in: int = 1
    """Concurrent migrations into one instance."""
    selection: str = "paper"
    """Which request a source gives up: paper (lower priority, then shorter) | SR | LR | FCW."""

    def __post_init__(self) -> None:
        if self.in_threshold < self.out_threshold:
            raise PolicyConfigError("in_threshold must be >= out_threshold", "in_threshold")
        if self.max_out < 1 or self.max_in < 1:
            raise PolicyConfigError("max_out and max_in must be >= 1", "max_out")


@dataclass(frozen=True)
class ScalingConfig:
    enabled: bool = False
    """Auto-scaling on or off."""
    scale_out_below: float = 10.0
    """Add an instance when the average normal-priority freeness over the window is below this."""
    scale_in_above: float = 60.0
    """Drain an instance when the average is above this."""
    window_s: float = 10.0
    """Length of the averaging window."""
    cooldown_s: float = 30.0
    """Quiet time after a scaling action."""
    min_instances: int = 1
    """Never scale in below this."""
    max_instances: int = 16
    """Never scale out above this."""

    def __post_init__(self) -> None:
        if not self.scale_out_below < self.scale_in_above:
            raise PolicyConfigError("scale_out_below must be < scale_in_above", "scale_out_below")
        if not 1 <= self.min_instances <= self.max_instances:
            raise PolicyConfigError("need 1 <= min_instances <= max_instances", "min_instances")


@dataclass(frozen=True)
class SchedulingConfig:
    freeness: FreenessConfig = field(default_factory=FreenessConfig)
    """Virtual usage: headroom per priority."""
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    """Dispatch policy."""
    rescheduling: ReschedulingConfig = field(default_factory=ReschedulingConfig)
    """Migration pairing and request selection."""
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    """Auto-scaling."""

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SchedulingConfig:
        d = dict(d or {})
        unknown = sorted(set(d) - {"freeness", "dispatch", "rescheduling", "scaling"})
        if unknown:
            raise PolicyConfigError(f"unknown field {unknown[0]!r} in the scheduling config", unknown[0])
        fr = dict(d.get("freeness") or {})
        if "headroom_tokens" in fr:
            fr["headroom_tokens"] = {int(_priority_key(k)): int(v) for k, v in fr["headroom_tokens"].items()}
        return cls(freeness=from_dict(FreenessConfig, fr, "freeness."),
                   dispatch=from_dict(DispatchConfig, d.get("dispatch"), "dispatch."),
                   rescheduling=from_dict(ReschedulingConfig, d.get("rescheduling"), "rescheduling."),
                   scaling=from_dict(ScalingConfig, d.get("scaling"), "scaling."))


def _priority_key(k: Any) -> int:
    if isinstance(k, str) and k.lower() in ("high", "normal"):
        return 1 if k.lower() == "high" else 0
    return int(k)
