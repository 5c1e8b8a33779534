"""Issue 47's shedding goal, first half, as one measure for the simulator and the real cluster:
"with shedding allowed, no interactive request misses its TTFT objective because of queued
batch work". Pure: it reads per-request records, whichever world made them.

An interactive request that missed its TTFT objective missed it *because of queued batch work*
when a batch request was prefilled (first scheduled) on the same instance after the
interactive one arrived and before its first token: batch work went ahead of it. Its other
misses (waiting for interactive work, its own long prefill, memory) are reported apart.

The instance is the one a record names: the simulator's and the gateway's metrics name the
instance that *finished* the request, so a request migrated after its prefill is placed where
it ended, not where it was prefilled (the count's known blind spot; migration moves running
requests, after their prefill).
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ShedRecord:
    """One request as the measure sees it; times in one clock (seconds)."""

    slo_class: str
    is_shed: bool = False
    """Refused early (a 429): no other field is read."""
    instance_id: str = ""
    arrival_s: float = 0.0
    prefill_start_s: float | None = None
    """First scheduled (its prefill began); None: never."""
    first_token_s: float | None = None
    num_migrations: int = 0
    """Live migrations it went through: its prefill's instance may not be ``instance_id``."""


def _prefills(records: Iterable[ShedRecord], cls: str) -> dict[str, list[float]]:
    """Per instance, the sorted prefill starts of ``cls``'s served requests."""
    starts: dict[str, list[float]] = {}
    for r in records:
        if r.slo_class == cls and not r.is_shed and r.prefill_start_s is not None:
            starts.setdefault(r.instance_id, []).append(r.prefill_start_s)
    for v in starts.values():
        v.sort()
    return starts


def ahead(prefills: Sequence[float], r: ShedRecord) -> int:
    """Prefills (sorted starts on ``r``'s instance) after ``r`` arrived and before its
    first token (or ever after, with none)."""
    end = r.first_token_s if r.first_token_s is not None else float("inf")
    return bisect.bisect_left(prefills, end) - bisect.bisect_right(prefills, r.arrival_s)


def measure(records: Sequence[ShedRecord], ttft_s: float, tight: str = "interactive",
            loose: str = "batch") -> dict[str, Any]:
    """The goal's counts: per class requests, shed and their share; of ``tight``'s served
    requests those over ``ttft_s`` (no first token counts as over), split into those with
    ``loose`` work prefilled ahead of them on their instance and the rest (of which those with
    other ``tight`` work prefilled ahead); the goal met when the first is 0. The blind spot's
    size: served ``loose`` requests that migrated (prefilled maybe elsewhere) and misses that
    migrated."""
    by_class: dict[str, dict[str, Any]] = {}
    for r in records:
        c = by_class.setdefault(r.slo_class, {"num_requests": 0, "num_shed": 0})
        c["num_requests"] += 1
        c["num_shed"] += r.is_shed
    for c in by_class.values():
        c["shed_share"] = c["num_shed"] / c["num_requests"]
    batch, own = _prefills(records, loose), _prefills(records, tight)
    missed = [r for r in records if r.slo_class == tight and not r.is_shed
              and (r.first_token_s is None or r.first_token_s - r.arrival_s > ttft_s)]
    behind = [n for r in missed if (n := ahead(batch.get(r.instance_id, ()), r)) > 0]
    other = [r for r in missed if not ahead(batch.get(r.instance_id, ()), r)]
    return {"classes": by_class, "ttft_s": ttft_s, "num_missed_ttft": len(missed),
            "num_missed_by_batch": len(behind), "num_missed_other": len(other),
            "num_missed_other_behind_own_class": sum(ahead(own.get(r.instance_id, ()), r) > 0 for r in other),
            "num_batch_prefills_ahead": sum(behind), "goal_met": not behind,
            "num_missed_migrated": sum(r.num_migrations > 0 for r in missed),
            "num_batch_migrated": sum(r.num_migrations > 0 for r in records if r.slo_class == loose)}


# -- the simulator: its metrics collector's finished requests and shed counts ------------------
def records_from_sim(metrics: Any) -> list[ShedRecord]:
    """A simulator run's records (``sim.metrics.MetricsCollector``: ``requests`` parallel to
    ``slo_names``, the trace naming each request's class; ``num_shed_by_name``)."""
    out = [ShedRecord(c, False, m.instance_id, m.arrival_time, m.first_scheduled_time, m.first_token_time,
                      m.num_migrations)
           for m, c in zip(metrics.requests, metrics.slo_names, strict=True)]
    out += [ShedRecord(c, True) for c, k in metrics.num_shed_by_name.items() for _ in range(k)]
    return out


# -- the real cluster: the gateway's "Finished request" lines and the client's 429s ------------
FINISHED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) .*Finished request \S+: instance=(\S+) .*"
                      r"ttft=(\S+) e2e=(\S+) queue=(\S+) migrations=(\d+) slo_class=(\S+)$")


def _secs(x: str) -> float | None:
    return None if x == "-" else float(x.rstrip("s"))


def records_from_log(lines: Iterable[str]) -> list[ShedRecord]:
    """A serve log's finished requests that named a class (the line's ``slo_class=``): the
    line's stamp (wall clock, ms) is the finish, so arrival = stamp - e2e, the prefill's
    start arrival + queue, the first token arrival + ttft."""
    out = []
    for line in lines:
        m = FINISHED.match(line.rstrip("\n"))
        if m is None:
            continue
        stamp, inst, ttft, e2e, queue, num_migrations, cls = m.groups()
        e = _secs(e2e)
        if e is None:
            continue
        arrival = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp() - e
        q, t = _secs(queue), _secs(ttft)
        out.append(ShedRecord(cls, False, inst, arrival, None if q is None else arrival + q,
                              None if t is None else arrival + t, int(num_migrations)))
    return out


def shed_from_client(names: Sequence[str | None], errors: Sequence[str | None]) -> list[ShedRecord]:
    """The client's 429s (``RequestRecord.error`` naming HTTP 429), one record each, by class."""
    return [ShedRecord(n, True) for n, e in zip(names, errors, strict=True)
            if n is not None and e is not None and e.startswith("HTTP 429")]
