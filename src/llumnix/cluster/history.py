"""What LlumSched remembers of past migrations: full counts, and the last ``HISTORY``
reports (a long-running cluster's memory and ``/admin/cluster`` stay bounded)."""
from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

from llumnix.logging_setup import migration_line
from llumnix.migration import reasons

log = logging.getLogger(__name__)

HISTORY = 1000
"""Migration reports (and scaling events) kept; the counts are kept in full."""


class MigrationHistory:
    def __init__(self, maxlen: int = HISTORY) -> None:
        self.reports: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.num_committed = self.num_committed_queued = self.num_aborted = 0
        self.num_blocks_sent = self.num_blocks_adopted = 0
        self.aborted_by_reason: Counter[str] = Counter()
        """Every abort by its ``migration.reasons`` code."""
        self._keys: deque[tuple[Any, ...]] = deque(maxlen=maxlen)
        self._key_set: set[tuple[Any, ...]] = set()
        """The last reports' identities: a report told as it ends and again in its round's
        return is counted once."""

    def _is_new(self, m: dict[str, Any]) -> bool:
        if m.get("request_id") is None or m.get("start_time") is None:
            return True  # a failed round's line: nothing to know it by
        key = (m["request_id"], m.get("src_instance_id"), m["start_time"])
        if key in self._key_set:
            return False
        if len(self._keys) == self._keys.maxlen:
            self._key_set.discard(self._keys[0])
        self._keys.append(key)
        self._key_set.add(key)
        return True

    def add(self, reports: Iterable[dict[str, Any]], now: float = 0.0) -> None:
        """``now``: when LlumSched learned of them, on its wall clock (a report's own times
        are on its source's monotonic clock): ``reported_at``, the dashboard's timeline."""
        for m in reports:
            if not self._is_new(m):
                continue
            m = {**m, "reported_at": now}
            if m.get("committed"):
                self.num_committed += 1
                self.num_committed_queued += bool(m.get("was_queued"))
                self.num_blocks_sent += int(m.get("num_blocks", 0))
                self.num_blocks_adopted += int(m.get("num_blocks_cached", 0))
            else:
                self.num_aborted += 1
                m["abort_code"] = reasons.of_report(m)  # a failed round's text, classified once
                self.aborted_by_reason[m["abort_code"]] += 1
            self.reports.append(m)
            log.info("%s", migration_line(m))  # LlumSched's log: one line per migration

    def start_waits(self) -> list[float]:
        """The recent reports' ``start_wait_s`` (``start_spans``), oldest first."""
        return [w for w in (start_spans(m)["start_wait_s"] for m in self.reports) if w is not None]

    def summary(self, in_flight: Iterable[str]) -> dict[str, Any]:
        """``/admin/cluster``'s migrations. A queued request moves as metadata and never
        stalls: its migrations are counted apart, and only running ones have a downtime."""
        downtimes = [m["downtime"] for m in self.reports if m.get("committed") and m.get("downtime") is not None]
        recent = list(self.reports)[-50:]
        return {"committed": self.num_committed,
                "committed_running": self.num_committed - self.num_committed_queued,
                "committed_queued": self.num_committed_queued,
                "aborted": self.num_aborted,
                # every code, counted since LlumSched started (0 where none yet): /metrics' counter
                "aborted_by_reason": {r: self.aborted_by_reason[r] for r in reasons.ALL},
                "in_flight": sorted(in_flight),
                "blocks_sent": self.num_blocks_sent,
                "blocks_adopted": self.num_blocks_adopted,
                "downtime_s": downtimes[-20:],
                # from the order's arrival at the source to the first stage's begin (issue 45)
                "start_wait_s": self.start_waits()[-20:],
                "recent_downtimes_s": downtimes,
                "recent": [{k: m.get(k) for k in ("request_id", "src_instance_id", "dst_instance_id", "committed",
                                                  "abort_reason", "abort_code", "end_time", "downtime",
                                                  "was_queued", "reported_at")} | start_spans(m) for m in recent]}


def start_spans(m: dict[str, Any]) -> dict[str, float | None]:
    """A report's way from its order to its first stage's end, by its marks (all on its
    source's clock): ``start_wait_s`` from the order's arrival at the source (the instance
    actor's ``migrate_out``) to the first stage's begin, ``first_stage_s`` the first stage
    (reservation, KV write, post-stage check). None where a mark is missing (a migration
    named by a benchmark, a queued request's)."""
    marks = m.get("marks") or {}

    def span(a: str, b: str) -> float | None:
        return marks[b] - marks[a] if a in marks and b in marks else None

    return {"start_wait_s": span("order_received", "first_stage"), "first_stage_s": span("first_stage", "first_copied")}


REACTION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ReactionHistogram:
    """Rescheduling reaction times (``policy/trigger.Reactions``): cumulative Prometheus
    buckets since LlumSched started, and the last ``HISTORY`` samples for percentiles."""

    def __init__(self, buckets: tuple[float, ...] = REACTION_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0
        self.recent: deque[float] = deque(maxlen=HISTORY)

    def observe(self, seconds: float) -> None:
        for i, le in enumerate(self.buckets):
            if seconds <= le:
                self.counts[i] += 1
        self.count += 1
        self.sum += seconds
        self.recent.append(seconds)

    def summary(self) -> dict[str, Any]:
        """``/admin/cluster``'s ``reaction``: cumulative ``buckets`` as ``[le, count]``
        (``+Inf`` is ``count``), ``sum``, ``count``, and the recent samples' P50 and P99."""
        recent = sorted(self.recent)

        def pct(q: float) -> float | None:
            return recent[min(len(recent) - 1, int(q * len(recent)))] if recent else None

        return {"buckets": [[le, n] for le, n in zip(self.buckets, self.counts, strict=True)],
                "sum": self.sum, "count": self.count, "p50_s": pct(0.5), "p99_s": pct(0.99),
                "recent_s": list(self.recent)[-50:]}
