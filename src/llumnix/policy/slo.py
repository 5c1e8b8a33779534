"""SLO classes: per-request latency objectives, named, with the rules of each class.

YAML (``scheduling.slo``; every key optional)::

    slo:
      classes:
        interactive: {ttft_s: 1.0, tpot_s: 0.1, shed_share: 0.0, priority: high}
        batch:       {ttft_s: 10.0, tpot_s: 0.3, shed_share: 0.0, priority: normal}
      default_class: batch        # a request that names no class and whose priority maps to none
      rescue: false               # rescue by migration (opt-in: it costs goodput; policy/slo_rescue.py)
      output_tokens: 256          # output-length estimate before any request finished
      engine_order: deadline      # fcfs | overdue | deadline: how engines order queues by the objectives

A class maps onto today's priorities: a request that names no class gets the class of
its priority (the first class with that priority), so an operator who only sets
priorities gets objectives too; a class's requests run at its priority.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Priority
from llumnix.engine.objectives import ORDERS

# policy/config.py nests SLOConfig in SchedulingConfig, so this module cannot import it:
# its errors are built here the same way (PolicyConfigError is an InvalidRequestError).


def bad_value(field_path: str, problem: str) -> InvalidRequestError:
    from llumnix.policy.config import bad_value as policy_bad_value

    return policy_bad_value(field_path, problem)


def _unknown(message: str, param: str) -> InvalidRequestError:
    from llumnix.policy.config import PolicyConfigError

    return PolicyConfigError(message, param)


@dataclass(frozen=True)
class SLOClass:
    """One class of requests and its objectives."""

    name: str
    ttft_s: float
    """Time to first token, from arrival (queueing included)."""
    tpot_s: float
    """Mean time per output token after the first."""
    shed_share: float = 0.0
    """Largest share of the class's requests that may be refused early when no instance
    can meet its objectives (0: always queue at the least-bad instance)."""
    priority: int = int(Priority.NORMAL)
    """The priority the class's requests run at, and whose requests fall in it."""

    def is_met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        """Both objectives hold (a one-token request has no TPOT: only TTFT counts)."""
        return ttft_s is not None and ttft_s <= self.ttft_s and (tpot_s is None or tpot_s <= self.tpot_s)


def _default_classes() -> dict[str, Any]:
    return {"interactive": {"ttft_s": 1.0, "tpot_s": 0.1, "priority": "high"},
            "batch": {"ttft_s": 10.0, "tpot_s": 0.3, "priority": "normal"}}


_CLASS_KEYS = ("ttft_s", "tpot_s", "shed_share", "priority")


def _number(where: str, value: Any, low: float, high: float | None = None, *, open_low: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        value > low if open_low else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        raise bad_value(where, f"must be a number {bound}{'' if high is None else f' and <= {high:g}'}, "
                               f"got {value!r}")
    return float(value)


def make_class(name: str, value: Any) -> SLOClass:
    """A class from its YAML mapping (or an ``SLOClass``, or ``asdict``'s copy of one)."""
    if isinstance(value, SLOClass):
        return value
    where = f"slo.classes.{name}"
    if not isinstance(value, dict):
        raise bad_value(where, f"must be a mapping {{ttft_s, tpot_s, shed_share, priority}}, got {value!r}")
    d = {k: v for k, v in value.items() if k != "name"}
    unknown = sorted(set(d) - set(_CLASS_KEYS))
    if unknown:
        raise _unknown(f"unknown field '{where}.{unknown[0]}' (known: {', '.join(_CLASS_KEYS)})",
                       f"{where}.{unknown[0]}")
    for key in ("ttft_s", "tpot_s"):
        if key not in d:
            raise bad_value(f"{where}.{key}", "is required")
    from llumnix.policy.config import PolicyConfigError, priority_level

    try:
        priority = priority_level(d.get("priority", int(Priority.NORMAL)))
    except PolicyConfigError:
        raise bad_value(f"{where}.priority", f"unknown priority {d['priority']!r} (high, normal or an integer)"
                        ) from None
    return SLOClass(name, _number(f"{where}.ttft_s", d["ttft_s"], 0.0), _number(f"{where}.tpot_s", d["tpot_s"], 0.0),
                    _number(f"{where}.shed_share", d.get("shed_share", 0.0), 0.0, 1.0, open_low=False), priority)


@dataclass(frozen=True)
class SLOConfig:
    classes: dict[str, Any] = field(default_factory=_default_classes)
    """Per class name: ``{ttft_s, tpot_s, shed_share, priority}`` (seconds; share in [0, 1];
    priority high, normal or an integer). Default: interactive (1 s, 0.1 s, high) and
    batch (10 s, 0.3 s, normal)."""
    default_class: str = "batch"
    """The class of a request that names none and whose priority no class has."""
    rescue: bool = False
    """Rescue by migration: move a queued request predicted to miss its TTFT, or work off an
    instance whose requests' predicted TPOT breaks their class's objective (only with
    rescheduling on and the ``slo`` policy). Off by default: in issue 47's simulator goal
    (``benchmarks/slo/goal.yaml``, seeds 0-2) the ``slo`` policy's goodput is 44/48/>=56
    req/s without it and 40/44/52 with it, after the fixes to its TPOT check and chains
    (36/48/52 before them); the gain is the engines' deadline order."""
    output_tokens: int = 256
    """Output-length estimate (tokens) until finished requests teach the predictor."""
    engine_order: str = "deadline"
    """How the engines order their queues by the classes' objectives (only with the ``slo``
    policy; ``engine/objectives.py``): ``fcfs`` (priority, then arrival, as without
    classes), ``overdue`` (a queued request past its TTFT objective with no token yet has
    missed it for good: it is served after every request that can still meet theirs, and
    preempted first) or ``deadline`` (and, within a priority, by deadline: a request's
    first token is due at arrival + TTFT, a request with tokens is on pace until its first
    token + TPOT x its tokens; a queued request due a first token may preempt running ones
    due later)."""

    def __post_init__(self) -> None:
        if not isinstance(self.classes, dict) or not self.classes:
            raise bad_value("slo.classes", "must be a non-empty mapping of class name to objectives")
        norm = {str(k): make_class(str(k), v) for k, v in self.classes.items()}
        object.__setattr__(self, "classes", norm)
        if self.default_class not in norm:
            raise bad_value("slo.default_class", f"unknown class {self.default_class!r} (known: {', '.join(norm)})")
        if not isinstance(self.rescue, bool):
            raise bad_value("slo.rescue", f"must be true or false, got {self.rescue!r}")
        if self.engine_order not in ORDERS:
            raise bad_value("slo.engine_order", f"must be one of {', '.join(ORDERS)}, got {self.engine_order!r}")
        if isinstance(self.output_tokens, bool) or not isinstance(self.output_tokens, int) or self.output_tokens < 1:
            raise bad_value("slo.output_tokens", f"must be an integer >= 1, got {self.output_tokens!r}")

    def get(self, name: str) -> SLOClass:
        """The class called ``name``; an unknown name raises an error naming ``slo_class``."""
        cls = self.classes.get(name)
        if cls is None:
            raise _unknown(f"unknown slo_class {name!r} (known: {', '.join(self.classes)})", "slo_class")
        return cls  # type: ignore[no-any-return]

    def for_priority(self, priority: int) -> SLOClass:
        """The class of a request that names none: the first with its priority, else the default."""
        for cls in self.classes.values():
            if cls.priority == priority:
                return cls  # type: ignore[no-any-return]
        return self.classes[self.default_class]  # type: ignore[no-any-return]

    def objectives(self) -> dict[str, tuple[float, float]]:
        """Per class name its (TTFT, TPOT) objectives, what an engine orders its queue by
        (``EngineCore.set_objectives``; each request carries its class by name)."""
        return {name: (c.ttft_s, c.tpot_s) for name, c in self.classes.items()}

    def classes_of(self) -> dict[int, str]:
        """Per priority some class has, the class of a request of that priority that names
        none (``for_priority``): how an engine resolves such a request once, as it is added."""
        return {c.priority: self.for_priority(c.priority).name for c in self.classes.values()}

    def overdue_limits(self) -> dict[str, float]:
        """Per class name the TTFT past which the engines serve a queued request last (empty
        with ``engine_order: fcfs``)."""
        return {} if self.engine_order == "fcfs" else {n: o[0] for n, o in self.objectives().items()}

    def resolve(self, name: str | None, priority: int) -> SLOClass:
        return self.for_priority(priority) if name is None else self.get(name)

    def class_of(self, name: str, priority: int) -> SLOClass:
        """The class a request or its status brief carries (``RequestBrief.slo_class``); one
        that carries none ("": it entered where no classes were known) is its priority's."""
        cls = self.classes.get(name) if name else None
        return self.resolve(name or None, priority) if cls is None else cls
