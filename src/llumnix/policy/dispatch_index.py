"""Incremental dispatch for single-metric policies: O(1) Python work per dispatch.

A pipeline whose picker is ``max-score`` and whose one scorer is a key metric
(``pipeline.KEYS``: a per-instance number, min-max normalised over candidates)
picks the candidate with the best raw metric, lowest instance id on ties:
normalisation is monotone, so it never changes the winner. The index keeps one
sort key per instance that passes the static filters (functions of the status
alone), recomputed only when that instance's view changes (a report, a
dispatch to it), and a dispatch is one C-level ``min`` over those keys.

Dynamic filters (``fresh``: depends on the clock) are checked on the winner
only. A winner that passes them is also the winner among the candidates that
pass them (a subset that contains it); a winner that fails them, or a
non-finite best metric (where clamping makes ties the raw order does not
see), sends the caller to the full pipeline, which decides exactly as before.

    keys: {instance_id: (-metric or +metric, instance_id)}    min(keys.values()) -> winner
"""
from __future__ import annotations

import math

from llumnix.core.status import InstanceStatus
from llumnix.policy.pipeline import FILTERS, KEYS, DispatchContext, Pipeline

STATIC_FILTERS = frozenset({"schedulable", "not-terminating"})
"""Filters that read only the status, so their verdict is part of the cached key."""
DYNAMIC_FILTERS = frozenset({"fresh"})
"""Filters that read the clock: checked on the winner at each dispatch."""

FALLBACK = "\x00fallback"
"""``pick``'s answer when the full pipeline must decide."""


class DispatchIndex:
    def __init__(self, pipeline: Pipeline) -> None:
        name, _ = pipeline.scorers[0]
        self._metric = KEYS[name]
        self._static = [FILTERS[f] for f in pipeline.filters if f in STATIC_FILTERS]
        self._dynamic = [FILTERS[f] for f in pipeline.filters if f in DYNAMIC_FILTERS]
        self._keys: dict[str, tuple[float, str]] = {}

    @staticmethod
    def supports(pipeline: Pipeline) -> bool:
        return (pipeline.picker == "max-score" and len(pipeline.scorers) == 1
                and pipeline.scorers[0][0] in KEYS
                and all(f in STATIC_FILTERS or f in DYNAMIC_FILTERS for f in pipeline.filters))

    def update(self, view: InstanceStatus, ctx: DispatchContext) -> None:
        """Re-key one instance after its view (or anything its metric reads) changed."""
        iid = view.instance_id
        for f in self._static:  # a loop, not all(genexpr): once per instance per report
            if not f(view, ctx):
                self._keys.pop(iid, None)
                return
        m = self._metric.value(view, ctx)
        self._keys[iid] = (-m if self._metric.higher_is_better else m, iid)

    def remove(self, instance_id: str) -> None:
        self._keys.pop(instance_id, None)

    def passing(self) -> dict[str, tuple[float, str]]:
        """Per instance that passes the static filters: its key (smaller is better). Read only."""
        return self._keys

    def passes_dynamic(self, view: InstanceStatus, ctx: DispatchContext) -> bool:
        return all(f(view, ctx) for f in self._dynamic)

    def pick(self, views: dict[str, InstanceStatus], ctx: DispatchContext) -> str | None:
        """The winner, None when no instance passes the static filters, or FALLBACK."""
        if not self._keys:
            return None
        key, iid = min(self._keys.values())
        if not math.isfinite(key):
            return FALLBACK
        return iid if self.passes_dynamic(views[iid], ctx) else FALLBACK
