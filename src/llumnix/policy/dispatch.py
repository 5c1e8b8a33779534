"""Named dispatch policies, each a pipeline configuration.

================ ===================================================== ==============
policy           scorer (weight)                                       picker
================ ===================================================== ==============
llumnix          queue-aware-freeness; ``queued: head``: freeness       max-score
infaas++         memory-load; ``metric: freeness``: freeness            max-score
round-robin      fewest-sent                                           max-score
least-requests   fewest-requests                                       max-score
random           -                                                     random
power-of-two     fewest-requests                                       power-of-two
llm-d            queue-depth (queue_weight), kv-utilization (kv_weight) max-score
                 and, with prefix_weight > 0, prefix-match (prefix_weight)
slo              predicted-slo (``scheduling.slo``'s classes); ``rank:     max-score
                 freeness``: predicted-slo-freeness
custom           ``params``: filters, scorers [{name, weight}], picker ``params``
================ ===================================================== ==============

``slo`` (issue 47; ``policy/slo_dispatch.py``) places a request where it is predicted to meet
its SLO class's objectives without pushing the requests already there past their TPOT
objectives; among those, with the most slack (``rank: slack``, the default) or the highest
queue-aware freeness (``rank: freeness``); when none meets, at the least-bad one (or it is
shed, for a class with a shed share). With rescheduling on and ``scheduling.slo.rescue``
it also rescues requests by migration (opt-in, ``policy/slo_rescue.py``).

max-score breaks ties by the lowest instance id (``tie_break: random``: by the RNG).
Every policy filters with schedulable, not-terminating and fresh.

``llumnix`` and ``infaas++`` differ at dispatch only in their load metric.
Llumnix picks the highest freeness (M - sum V) / B: only the head-of-line queued
request counts its demand, running requests carry their priority's headroom, and
free space is divided by the batch size (how many decode steps it lasts).
INFaaS++ (the paper's baseline: INFaaS made to watch GPU memory, queued demand
included) picks the lowest memory load: used blocks plus the demand of every
queued request, over total blocks. With ``params: {metric: freeness}`` INFaaS++
dispatches exactly like Llumnix, which is the reading where the two systems
differ only in that INFaaS++ never migrates. Beyond dispatch, only Llumnix migrates
(``ReschedulingConfig.enabled``).

``llumnix`` scores ``queue_aware_freeness`` by default (``queued: all``): every
queued request counts its demand and a batch slot, as the open-source Llumnix's
dispatch load does. ``queued: head`` is Algorithm 1 exactly, where only the head of
line counts: a queue behind it is invisible, so once a burst's requests show up queued
in a report the instance with the longest queue looks as free as before and takes
the next ones too (on the real cluster a 24-request burst's TTFT; in the simulator
Figure 11's M-M P99 prefill, 24.7 s against 9.7 s). Every simulator experiment since
Figure 11 names ``queued: all``; migration keeps Algorithm 1's freeness either way.

``llumnix`` with ``params: {shield: true}`` (not the paper's, off by default) picks with
``decode-shield``: a long prompt goes, among the near-freest instances, to the one where
its prefill stalls the fewest young decoding requests (``policy/decode_shield.py``).

``llumnix`` with ``params: {prefix: true}`` (not the paper's, off by default; optional
``prefix_slack``, default 4 requests, ``prefix_slack_ratio``, default 0, and
``prefix_min_tokens``, default 64) picks with ``prefix-affinity``: a request goes where the
longest prefix of its prompt was sent before, among the instances with at most
max(``prefix_slack``, ``prefix_slack_ratio`` x its requests) more requests (running and
queued) than the one freeness picks (``policy/prefix_affinity.py``). It needs the prompt's tokens in the
``DispatchRequest``; without them it picks as plain ``llumnix``.
"""
from __future__ import annotations

from typing import Any

from llumnix.policy import plugins as _plugins  # noqa: F401 - registers the built-ins
from llumnix.policy.config import DISPATCH_POLICIES, PolicyConfigError, bad_value
from llumnix.policy.pipeline import Pipeline
from llumnix.policy.prefix_affinity import PrefixOptions

_TIE = ("tie_break",)
POLICY_PARAMS: dict[str, tuple[str, ...]] = {
    "llumnix": ("queued", "shield", "prefix", "prefix_slack", "prefix_slack_ratio", "prefix_min_tokens", *_TIE),
    "infaas++": ("metric", *_TIE),
    "round-robin": _TIE,
    "least-requests": _TIE,
    "random": (),
    "power-of-two": (),
    "llm-d": ("queue_weight", "kv_weight", "prefix_weight", *_TIE),
    "slo": ("rank", *_TIE),
    "custom": ("filters", "scorers", "picker"),
}
"""The params each policy accepts; anything else is a configuration error."""


def _picker(p: dict[str, Any]) -> str:
    tie = p.get("tie_break", "id")
    if tie not in ("id", "random"):
        raise bad_value("dispatch.params.tie_break", f"must be 'id' or 'random', got {tie!r}")
    return "max-score" if tie == "id" else "max-score-random"


def _weight(p: dict[str, Any], key: str) -> float:
    try:
        return float(p.get(key, 1.0))
    except (TypeError, ValueError):
        raise bad_value(f"dispatch.params.{key}", f"must be a number, got {p[key]!r}") from None


def _flag(p: dict[str, Any], key: str) -> bool:
    v = p.get(key, False)
    if not isinstance(v, bool):
        raise bad_value(f"dispatch.params.{key}", f"must be true or false, got {v!r}")
    return v


def _count(p: dict[str, Any], key: str, default: int, least: int) -> int:
    v = p.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise bad_value(f"dispatch.params.{key}", f"must be an integer >= {least}, got {v!r}")
    return v


def prefix_options(name: str, params: dict[str, Any] | None) -> PrefixOptions | None:
    """The prefix-affinity settings of a policy, or None when it does not use them."""
    p = params or {}
    if name != "llumnix" or not _flag(p, "prefix"):
        return None
    ratio = p.get("prefix_slack_ratio", PrefixOptions.slack_ratio)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < float("inf"):
        raise bad_value("dispatch.params.prefix_slack_ratio", f"must be a number >= 0, got {ratio!r}")
    return PrefixOptions(slack=_count(p, "prefix_slack", PrefixOptions.slack, 0), slack_ratio=float(ratio),
                         min_tokens=_count(p, "prefix_min_tokens", PrefixOptions.min_tokens, 1))


def make_pipeline(name: str, params: dict[str, Any] | None = None) -> Pipeline:
    """The pipeline of a named policy; unknown names or params raise PolicyConfigError."""
    if name not in POLICY_PARAMS:
        raise PolicyConfigError(f"unknown dispatch policy {name!r} (known: {', '.join(DISPATCH_POLICIES)})",
                                "dispatch.policy")
    p = dict(params or {})
    unknown = sorted(set(p) - set(POLICY_PARAMS[name]))
    if unknown:
        known = ", ".join(POLICY_PARAMS[name]) or "none"
        raise PolicyConfigError(f"unknown field 'dispatch.params.{unknown[0]}' for policy {name!r} "
                                f"(known: {known})", f"dispatch.params.{unknown[0]}")
    if name == "llumnix":
        queued = p.get("queued", "all")
        if queued not in ("head", "all"):
            raise bad_value("dispatch.params.queued", f"must be 'head' or 'all', got {queued!r}")
        scorer = "freeness" if queued == "head" else "queue-aware-freeness"
        shield = _flag(p, "shield")
        prefix = prefix_options(name, p) is not None
        if shield and prefix:
            raise bad_value("dispatch.params.prefix", "cannot be combined with shield (both choose the pick)")
        for key in ("prefix_slack", "prefix_slack_ratio", "prefix_min_tokens"):
            if key in p and not prefix:
                raise bad_value(f"dispatch.params.{key}", "applies only with prefix: true")
        picker = "decode-shield" if shield else "prefix-affinity" if prefix else _picker(p)
        return Pipeline(scorers=((scorer, 1.0),), picker=picker)
    if name == "infaas++":
        metric = p.get("metric", "memory-load")
        if metric not in ("memory-load", "freeness"):
            raise bad_value("dispatch.params.metric", f"must be 'memory-load' or 'freeness', got {metric!r}")
        return Pipeline(scorers=((metric, 1.0),), picker=_picker(p))
    if name == "round-robin":
        return Pipeline(scorers=(("fewest-sent", 1.0),), picker=_picker(p))
    if name == "least-requests":
        return Pipeline(scorers=(("fewest-requests", 1.0),), picker=_picker(p))
    if name == "random":
        return Pipeline(scorers=(), picker="random")
    if name == "power-of-two":
        return Pipeline(scorers=(("fewest-requests", 1.0),), picker="power-of-two")
    if name == "slo":
        rank = p.get("rank", "slack")
        if rank not in ("slack", "freeness"):
            raise bad_value("dispatch.params.rank", f"must be 'slack' or 'freeness', got {rank!r}")
        scorer = "predicted-slo" if rank == "slack" else "predicted-slo-freeness"
        return Pipeline(scorers=((scorer, 1.0),), picker=_picker(p))
    if name == "llm-d":
        scorers = [("queue-depth", _weight(p, "queue_weight")), ("kv-utilization", _weight(p, "kv_weight"))]
        prefix_weight = _weight(p, "prefix_weight") if "prefix_weight" in p else 0.0
        if prefix_weight:
            scorers.append(("prefix-match", prefix_weight))
        return Pipeline(scorers=tuple(scorers), picker=_picker(p))
    return _custom(p)


def _custom(p: dict[str, Any]) -> Pipeline:
    """``{filters: [..], scorers: [{name, weight}], picker}``, straight from YAML."""
    scorers = []
    for s in p.get("scorers", []):
        if not isinstance(s, dict) or "name" not in s or set(s) - {"name", "weight"}:
            raise bad_value("dispatch.params.scorers", f"each scorer is {{name, weight}}, got {s!r}")
        scorers.append((s["name"], _weight(s, "weight")))
    return Pipeline(filters=tuple(p.get("filters", Pipeline.filters)), scorers=tuple(scorers),
                    picker=p.get("picker", "max-score"))
