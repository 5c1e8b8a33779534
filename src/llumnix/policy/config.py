"""Frozen configuration of the scheduling policies, buildable from YAML dicts.

Every section rejects unknown keys with a ``PolicyConfigError`` naming the
field (``rescheduling.bogus``), and unknown policy names with the list of
known ones. Nothing here is mutated after construction.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Priority
from llumnix.policy.pd import PDConfig
from llumnix.policy.slo import SLOConfig

T = TypeVar("T")


class PolicyConfigError(InvalidRequestError):
    """A policy configuration names an unknown field or policy, or a bad value."""


def from_dict(cls: type[T], d: dict[str, Any] | None, where: str = "") -> T:
    """Build a config dataclass from a dict; unknown keys are an error naming the field."""
    if d is not None and not isinstance(d, dict):
        raise PolicyConfigError(f"{where.rstrip('.') or cls.__name__} must be a mapping, got {d!r}",
                                where.rstrip("."))
    d = dict(d or {})
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names)
    if unknown:
        raise PolicyConfigError(f"unknown field '{where}{unknown[0]}' (known: {', '.join(sorted(names))})",
                                f"{where}{unknown[0]}")
    try:
        return cls(**d)
    except TypeError as e:
        raise PolicyConfigError(f"{where.rstrip('.') or cls.__name__}: {e}") from e


def bad_value(field_path: str, problem: str) -> PolicyConfigError:
    """The error for a bad value: the message starts with the field's path."""
    return PolicyConfigError(f"{field_path}: {problem}", field_path)


_PRIORITY_NAMES = {p.name.lower(): int(p) for p in Priority}


def priority_level(key: Any) -> int:
    """A priority level from YAML: an int, or a name such as ``high`` / ``normal``."""
    if isinstance(key, str) and key.lower() in _PRIORITY_NAMES:
        return _PRIORITY_NAMES[key.lower()]
    try:
        return int(key)
    except (TypeError, ValueError):
        raise bad_value("freeness.headroom_tokens", f"unknown priority {key!r} "
                        f"(known: {', '.join(_PRIORITY_NAMES)} or an integer)") from None


@dataclass(frozen=True)
class FreenessConfig:
    headroom_tokens: dict[int, int] = field(
        default_factory=lambda: {int(Priority.HIGH): 1600, int(Priority.NORMAL): 0})
    """Per priority level: tokens of KV kept in reserve for its requests on an instance,
    shared among them (execution priority). Default: high = 1600, normal = 0."""

    def __post_init__(self) -> None:
        # YAML gives string keys ("high", "1"); normalise once, here.
        norm = {priority_level(k): int(v) for k, v in self.headroom_tokens.items()}
        object.__setattr__(self, "headroom_tokens", norm)
        if any(v < 0 for v in norm.values()):
            raise bad_value("freeness.headroom_tokens", "headroom must be >= 0")

    @cached_property
    def headroom_priorities(self) -> frozenset[int]:
        """The priority levels with a headroom (made once: every freeness reads it; not a
        field, so no config shows it)."""
        return frozenset(p for p, tokens in self.headroom_tokens.items() if tokens > 0)


DISPATCH_POLICIES = ("llumnix", "infaas++", "round-robin", "least-requests", "random", "power-of-two",
                     "llm-d", "slo", "custom")
SELECTIONS = ("paper", "SR", "LR", "FCW", "freed")
SCALING_SIGNALS = ("mean", "cluster", "demand")
DEFRAGS = ("paper", "hol")
QUEUED_MOVES = ("any", "fits")
PAIRINGS = ("paper", "fit", "stable", "even")
DST_QUEUES = ("head", "all")


@dataclass(frozen=True)
class DispatchConfig:
    policy: str = "llumnix"
    """llumnix | infaas++ | round-robin | random | least-requests | power-of-two | llm-d | slo | custom."""
    params: dict[str, Any] = field(default_factory=dict)
    """Policy-specific parameters (see ``dispatch.POLICY_PARAMS``); unknown keys are an error."""
    staleness_s: float = 2.0
    """Statuses older than this are not dispatched to (unless every one is stale)."""
    pending_grace_s: float = 1.0
    """How long a dispatched request may take to show up in its instance's reports before
    the scheduler stops counting it as pending there (0 in the simulator, where delivery
    is instant; about a second over Ray)."""
    prefix_evictions: bool = False
    """With a prefix index (``prefix`` affinity, the ``prefix-match`` scorer): forget the
    prefixes an instance reports it evicted (else only the index's own capacity bound
    forgets them)."""

    def __post_init__(self) -> None:
        if self.policy not in DISPATCH_POLICIES:
            raise PolicyConfigError(f"unknown dispatch policy {self.policy!r} "
                                    f"(known: {', '.join(DISPATCH_POLICIES)})", "dispatch.policy")
        if self.staleness_s <= 0:
            raise bad_value("dispatch.staleness_s", "must be > 0")
        if self.pending_grace_s < 0:
            raise bad_value("dispatch.pending_grace_s", "must be >= 0")
        if not isinstance(self.prefix_evictions, bool):
            raise bad_value("dispatch.prefix_evictions", f"must be true or false, got {self.prefix_evictions!r}")


@dataclass(frozen=True)
class ReschedulingConfig:
    enabled: bool = True
    """Run migration rounds at all (off for the round-robin and INFaaS++ baselines)."""
    out_threshold: float = 3.0
    """Instances with freeness below this are migration sources (the paper's migrate-out threshold)."""
    in_threshold: float = 3.0
    """Instances with freeness above this can be destinations; >= out_threshold. Equal by default,
    as in the paper's single threshold; set it higher for hysteresis against ping-pong."""
    max_out: int = 1
    """Concurrent migrations out of one instance."""
    max_in: int = 1
    """Concurrent migrations into one instance."""
    selection: str = "paper"
    """Which request a source gives up: paper (lower priority, then shorter) | SR | LR | FCW |
    freed (lower priority, then the fewest blocks moved per block freed on the source, then
    shorter: with prefix caching a block the request shares with others stays behind;
    without sharing it is the paper's order)."""
    pairing: str = "paper"
    """paper (lowest freeness with highest) | fit: with the highest that has room for the
    request the source will give up | stable: fit, and taking that request does not make
    the destination a source | even: fit, and the destination stays freer than the source
    is, so no move is undone by the next (``policy/pairing.py``; none is in the paper)."""
    dst_queue: str = "head"
    """How a destination's queue counts against it: head (Algorithm 1: only the head of
    line's demand, the rest 0) | all (every queued request's demand and a batch slot, as
    llumnix dispatch's ``queued: all`` counts it, ``freeness.queue_aware_freeness``; and a
    running request moves there only if it fits beyond that demand). Sources are judged
    by Algorithm 1 either way. With head, an instance whose queue a burst of dispatches
    has just filled (say 1 running, 3 queued, 9 of 10 blocks free) is the freest
    destination (F = 7); the move takes the blocks its queue was about to get, and its own
    younger requests are preempted as they grow (issue 32's bench, 2026-11-26)."""
    defrag: str = "paper"
    """paper (Algorithm 1) | hol: also move a blocked head-of-line request to an instance with
    room for it, and give it up first (``policy/defrag.py``; not in the paper)."""
    queued_moves: str = "any"
    """Which queued requests a source may give up: any (as the selection policy orders them) |
    fits: only one that starts at once on the destination, i.e. whose blocks fit in the
    destination's free blocks beyond its watermark and its own queue's demand
    (``freeness.room_for_queued``; not in the paper). Moving a queued request to an instance
    where it queues again gains nothing, and that instance then gives it up in turn. The
    whole destination queue counts, although a moved request keeps its arrival time and is
    served before the younger ones there: a move that jumps that queue delays the requests
    already waiting in it (counting only the older ones was measured on M-M 6.66 seed 0:
    P99 prefill 6.9 -> 12.5 s)."""

    min_tokens_left: int = 0
    """A running request with fewer output tokens left than this (its ``max_tokens`` less
    those made) is not migrated: a migration lasts at least as many decode steps as it has
    stages, and one its request outlives is work wasted (aborted ``source_finished``). 0
    (the paper's rule) migrates any request."""

    trigger_gap_s: float | None = 0.03
    """Triggered rescheduling (``policy/trigger.py``): a status that makes an instance a
    source, blocks its queue, or (while one waits) makes it a destination starts a pass at
    once, passes at least this many seconds apart; the periodic round
    (``deployment.reschedule_interval_s``) stays as the backstop. None (``null``): periodic
    rounds only. The cluster reads it; the simulator reschedules on its own rounds."""

    def __post_init__(self) -> None:
        if not isinstance(self.min_tokens_left, int) or self.min_tokens_left < 0:
            raise bad_value("rescheduling.min_tokens_left", "must be an integer >= 0")
        if self.trigger_gap_s is not None and not self.trigger_gap_s >= 0:
            raise bad_value("rescheduling.trigger_gap_s", "must be >= 0 (or null: periodic rounds only)")
        if self.in_threshold < self.out_threshold:
            raise bad_value("rescheduling.in_threshold", "must be >= out_threshold")
        for name in ("max_out", "max_in"):
            if getattr(self, name) < 1:
                raise bad_value(f"rescheduling.{name}", "must be >= 1")
        if self.pairing not in PAIRINGS:
            raise PolicyConfigError(f"unknown pairing policy {self.pairing!r} (known: {', '.join(PAIRINGS)})",
                                    "rescheduling.pairing")
        if self.dst_queue not in DST_QUEUES:
            raise PolicyConfigError(f"unknown dst_queue {self.dst_queue!r} (known: {', '.join(DST_QUEUES)})",
                                    "rescheduling.dst_queue")
        if self.defrag not in DEFRAGS:
            raise PolicyConfigError(f"unknown defrag policy {self.defrag!r} (known: {', '.join(DEFRAGS)})",
                                    "rescheduling.defrag")
        if self.queued_moves not in QUEUED_MOVES:
            raise PolicyConfigError(f"unknown queued_moves {self.queued_moves!r} "
                                    f"(known: {', '.join(QUEUED_MOVES)})", "rescheduling.queued_moves")
        if self.selection not in SELECTIONS:
            raise PolicyConfigError(f"unknown selection policy {self.selection!r} "
                                    f"(known: {', '.join(SELECTIONS)})", "rescheduling.selection")


@dataclass(frozen=True)
class ScalingConfig:
    enabled: bool = False
    """Auto-scaling on or off."""
    scale_out_below: float = 10.0
    """Add an instance when the average normal-priority freeness over the window is below this."""
    scale_in_above: float = 60.0
    """Drain an instance when the average is above this."""
    window_s: float = 10.0
    """Length of the averaging window; no decision before a full window has been observed."""
    cooldown_s: float = 30.0
    """Quiet time after a scaling action."""
    min_instances: int = 1
    """Never scale in below this many active (not terminating) instances."""
    max_instances: int = 16
    """Never scale out above this many active instances."""
    signal: str = "cluster"
    """What "average freeness" means: cluster (the freeness of the summed cluster, as the
    open-source Llumnix's ``avg_load``) | mean (the mean of the active instances'
    freeness, which one idle instance lifts by M/n) | demand (the summed cluster with every
    queued request's demand counted, not only the head of line's); ``average_normal_freeness``."""

    def __post_init__(self) -> None:
        if not self.scale_out_below < self.scale_in_above:
            raise bad_value("scaling.scale_out_below", "must be < scale_in_above")
        if not 1 <= self.min_instances <= self.max_instances:
            raise bad_value("scaling.min_instances", "need 1 <= min_instances <= max_instances")
        if self.window_s <= 0:
            raise bad_value("scaling.window_s", "must be > 0")
        if self.cooldown_s < 0:
            raise bad_value("scaling.cooldown_s", "must be >= 0")
        if self.signal not in SCALING_SIGNALS:
            raise PolicyConfigError(f"unknown scaling signal {self.signal!r} "
                                    f"(known: {', '.join(SCALING_SIGNALS)})", "scaling.signal")


_SECTIONS = {"freeness": FreenessConfig, "dispatch": DispatchConfig,
             "rescheduling": ReschedulingConfig, "scaling": ScalingConfig, "pd": PDConfig, "slo": SLOConfig}


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
    pd: PDConfig = field(default_factory=PDConfig)
    """Prefill-decode disaggregation: off (co-located), static roles or adaptive (``policy/pd.py``)."""
    slo: SLOConfig = field(default_factory=SLOConfig)
    """SLO classes (``policy/slo.py``): what the ``slo`` dispatch policy and rescue by migration aim at."""

    def __post_init__(self) -> None:
        # Validate the dispatch policy's params now, not at the first request.
        from llumnix.policy.dispatch import make_pipeline

        make_pipeline(self.dispatch.policy, self.dispatch.params)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SchedulingConfig:
        if d is not None and not isinstance(d, dict):
            raise PolicyConfigError(f"the scheduling config must be a mapping, got {d!r}")
        d = dict(d or {})
        unknown = sorted(set(d) - set(_SECTIONS))
        if unknown:
            raise PolicyConfigError(f"unknown field {unknown[0]!r} in the scheduling config "
                                    f"(known: {', '.join(_SECTIONS)})", unknown[0])
        return cls(**{name: from_dict(sec, d.get(name), f"{name}.")
                      for name, sec in _SECTIONS.items()})
