"""Named dispatch policies, each a pipeline configuration.

``llumnix`` and ``infaas++`` differ at dispatch in their load metric:
Llumnix picks the highest freeness ((M - sum V) / B: only the head-of-line
queued request counts, running requests carry priority headroom, and free
space is divided by the batch size, i.e. how many decode steps it lasts);
INFaaS++ picks the lowest memory load (used blocks plus the demand of every
queued request, over total blocks). Beyond dispatch, only Llumnix migrates.
"""
from __future__ import annotations

from typing import Any

from llumnix.policy import plugins as _plugins  # noqa: F401 - registers the built-ins
from llumnix.policy.config import DISPATCH_POLICIES, PolicyConfigError
from llumnix.policy.pipeline import Pipeline


def make_pipeline(name: str, params: dict[str, Any] | None = None) -> Pipeline:
    p = dict(params or {})
    if name == "llumnix":
        return Pipeline(scorers=(("freeness", 1.0),))
    if name == "infaas++":
        return Pipeline(scorers=(("memory-load", 1.0),))
    if name == "round-robin":
        return Pipeline(scorers=(("fewest-sent", 1.0),))
    if name == "least-requests":
        return Pipeline(scorers=(("fewest-requests", 1.0),))
    if name == "random":
        return Pipeline(scorers=(), picker="random")
    if name == "power-of-two":
        return Pipeline(scorers=(("fewest-requests", 1.0),), picker="power-of-two")
    if name == "llm-d":
        return Pipeline(scorers=(("queue-depth", float(p.get("queue_weight", 1.0))),
                                 ("kv-utilization", float(p.get("kv_weight", 1.0)))))
    if name == "custom":
        return Pipeline(filters=tuple(p.get("filters", Pipeline.filters)),
                        scorers=tuple((s["name"], float(s.get("weight", 1.0))) for s in p.get("scorers", [])),
                        picker=p.get("picker", "max-score"))
    raise PolicyConfigError(f"unknown dispatch policy {name!r} (known: {', '.join(DISPATCH_POLICIES)})",
                            "dispatch.policy")

