"""The metrics -> filters -> scorers -> picker pipeline every dispatch policy is written in.

Filters narrow the candidates; scorers return one value in [0, 1] per candidate
(higher is better); the framework clamps, weights and sums them; the picker
chooses. Plugins are registered by name, so a policy is configuration.

Candidates are sorted by instance id first, so ``max-score`` breaks ties by the
lowest id and the RNG-driven pickers are reproducible for a given seed.

Fallback when filters leave nothing: the ``fresh`` (staleness) filter steps
aside if it would drop every remaining candidate, since serving on an old view
beats refusing every request while reports are late. The other filters
(schedulable, not-terminating) are hard: if they leave nothing, ``pick``
returns None and the caller keeps the request queued.
"""
from __future__ import annotations

import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from llumnix.core.status import InstanceStatus
from llumnix.policy.config import FreenessConfig, PolicyConfigError
from llumnix.policy.prefix_affinity import PrefixOptions

if TYPE_CHECKING:
    from llumnix.policy.slo_dispatch import SLODispatch

_by_id = operator.attrgetter("instance_id")


@dataclass
class DispatchContext:
    """What plugins may read besides the statuses. No clock: ``now`` comes in."""

    now: float
    freeness: FreenessConfig
    staleness_s: float
    sent: dict[str, int] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    memo: dict[str, tuple[InstanceStatus, dict[str, float]]] = field(default_factory=dict)
    """Per instance id: the status object last seen and metrics computed from it. The
    scheduler keeps one across dispatches, so an unchanged status is not re-scored."""
    num_prompt_tokens: int | None = None
    """Prompt length of the request being dispatched (None when the caller does not say);
    read by request-aware plugins such as the ``decode-shield`` picker."""
    prefix_hits: dict[str, int] | None = None
    """Per instance id: leading blocks of the request's prompt sent there before (only
    instances with a match; None without prefix affinity), for the ``prefix-affinity`` picker."""
    prefix_options: PrefixOptions = field(default_factory=PrefixOptions)
    slo: SLODispatch | None = None
    """The request's SLO class and the latency predictor (the ``predicted-slo`` scorer; None
    for the other policies)."""

    def metric(self, key: KeyMetric, status: InstanceStatus) -> float:
        """``key.fn(status, self)``, computed once per status object (statuses are immutable)."""
        entry = self.memo.get(status.instance_id)
        if entry is not None and entry[0] is status:
            v = entry[1].get(key.name)
            if v is not None:
                return v
        else:
            entry = self.memo[status.instance_id] = (status, {})
        v = entry[1][key.name] = key.fn(status, self)
        return v


Filter = Callable[[InstanceStatus, DispatchContext], bool]
Scorer = Callable[[list[InstanceStatus], DispatchContext], list[float]]
Picker = Callable[[list[InstanceStatus], list[float], DispatchContext], InstanceStatus]


@dataclass(frozen=True)
class KeyMetric:
    """A scorer's raw per-instance number before min-max normalisation. Registering one
    (``register_key``) also registers its scorer, and lets ``DispatchIndex`` pick by it
    without scoring every candidate."""

    name: str
    fn: Callable[[InstanceStatus, DispatchContext], float]
    higher_is_better: bool
    per_status: bool
    """A function of the status alone: computed once per status object (``ctx.metric``)."""

    def value(self, s: InstanceStatus, ctx: DispatchContext) -> float:
        if self.per_status:  # no closure per call: once per instance per dispatch key
            return ctx.metric(self, s)
        return self.fn(s, ctx)

    def score(self, cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
        values = [self.value(s, ctx) for s in cands]
        return higher_is_better(values) if self.higher_is_better else lower_is_better(values)


FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {}
PICKERS: dict[str, Picker] = {}
KEYS: dict[str, KeyMetric] = {}


P = TypeVar("P", Filter, Scorer, Picker)


def register(table: dict[str, P], name: str) -> Callable[[P], P]:
    """Decorator registering a filter, scorer or picker under ``name`` (unique)."""
    def deco(fn: P) -> P:
        if name in table:
            raise ValueError(f"plugin {name!r} is already registered")
        table[name] = fn
        return fn
    return deco


def register_key(name: str, *, higher_is_better: bool, per_status: bool = True
                 ) -> Callable[[Callable[[InstanceStatus, DispatchContext], float]],
                               Callable[[InstanceStatus, DispatchContext], float]]:
    """Decorator registering a key metric ``fn(status, ctx)`` and the scorer made from it."""
    def deco(fn: Callable[[InstanceStatus, DispatchContext], float]
             ) -> Callable[[InstanceStatus, DispatchContext], float]:
        key = KeyMetric(name, fn, higher_is_better, per_status)
        register(SCORERS, name)(key.score)
        KEYS[name] = key
        return fn
    return deco


def lookup(table: dict[str, P], kind: str, name: str) -> P:
    if name not in table:
        raise PolicyConfigError(f"unknown {kind} {name!r} (known: {', '.join(sorted(table))})", kind)
    return table[name]


def higher_is_better(values: list[float]) -> list[float]:
    """Min-max normalise raw metrics into [0, 1]; all equal -> all 1."""
    finite = [v for v in values if v not in (float("inf"), float("-inf"))]
    if not finite:
        return [1.0 for _ in values]
    lo, hi = min(finite), max(finite)
    if hi == lo:
        return [1.0 if v >= lo else 0.0 for v in values]
    return [min(1.0, max(0.0, (v - lo) / (hi - lo))) for v in values]


def lower_is_better(values: list[float]) -> list[float]:
    return higher_is_better([-v for v in values])


@dataclass(frozen=True)
class Pipeline:
    """One dispatch policy: filter names, (scorer name, weight) pairs and a picker name."""

    filters: tuple[str, ...] = ("schedulable", "not-terminating", "fresh")
    scorers: tuple[tuple[str, float], ...] = (("freeness", 1.0),)
    picker: str = "max-score"

    def __post_init__(self) -> None:
        for f in self.filters:
            lookup(FILTERS, "filter", f)
        for s, w in self.scorers:
            lookup(SCORERS, "scorer", s)
            if w < 0:
                raise PolicyConfigError(f"weight of scorer {s!r} must be >= 0", "weight")
        lookup(PICKERS, "picker", self.picker)

    def pick(self, statuses: list[InstanceStatus], ctx: DispatchContext) -> str | None:
        """The chosen instance id, or None when no candidate survives the hard filters."""
        cands = self.candidates(statuses, ctx)
        if not cands:
            return None
        return PICKERS[self.picker](cands, self.scores(cands, ctx), ctx).instance_id

    def scores(self, cands: list[InstanceStatus], ctx: DispatchContext) -> list[float]:
        """Weighted sum of the clamped scorer outputs, one per candidate."""
        total = [0.0] * len(cands)
        for name, weight in self.scorers:
            values = SCORERS[name](cands, ctx)
            assert len(values) == len(cands), f"scorer {name!r} returned {len(values)} scores"
            total = [t + weight * (0.0 if v < 0.0 else 1.0 if v > 1.0 else v)
                     for t, v in zip(total, values, strict=True)]
        return total

    def candidates(self, statuses: list[InstanceStatus], ctx: DispatchContext) -> list[InstanceStatus]:
        cands = sorted(statuses, key=_by_id)
        for name in self.filters:
            kept = [s for s in cands if FILTERS[name](s, ctx)]
            # A staleness filter that would leave nothing is ignored: serving on an old
            # view beats refusing every request while reports are late.
            if not kept and name == "fresh":
                continue
            cands = kept
        return cands
