"""Issue 47's shedding goal, first half, as one measure for the simulator and the real cluster:
"with shedding allowed, no interactive request misses its TTFT objective because of queued
batch work". Pure: it reads per-request records, whichever world made them.

An interactive request that missed its TTFT objective missed it *because of queued batch work*
when a batch request was prefilled (first scheduled) on the instance where it was prefilled,
after it arrived and before its first token: batch work went ahead of it (the goal's measure).
Of those, the ones with batch work ahead while they could still meet their objective (before
arrival + TTFT) are counted apart: batch work that went ahead only once the request was late
(an FCFS queue's older batch requests when memory freed; the `slo` engines put an overdue
request behind all work that can still meet) came after the miss was settled. The other
misses (behind interactive work, their own prefill, memory held by running requests) are
reported apart.

A record's instance is where its prefill ran. The simulator knows it (the finishing instance
and the committed migrations' sources); the gateway's log names only the finishing one, so a
real request that migrated has an unknown instance (""): batch work of unknown instance in a
miss's window makes the miss *maybe* by batch (an upper bound), counted apart.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

UNKNOWN = ""
"""The instance of a record whose prefill's instance is not known."""


@dataclass(frozen=True)
class ShedRecord:
    """One request as the measure sees it; times in one clock (seconds)."""

    slo_class: str
    is_shed: bool = False
    """Refused early (a 429): no other field is read."""
    instance_id: str = UNKNOWN
    """Where its prefill ran (``UNKNOWN``: not known)."""
    arrival_s: float = 0.0
    prefill_start_s: float | None = None
    """First scheduled (its prefill began); None: never."""
    first_token_s: float | None = None


def _prefills(records: Iterable[ShedRecord], cls: str) -> dict[str, list[float]]:
    """Per instance, the sorted prefill starts of ``cls``'s served requests."""
    starts: dict[str, list[float]] = {}
    for r in records:
        if r.slo_class == cls and not r.is_shed and r.prefill_start_s is not None:
            starts.setdefault(r.instance_id, []).append(r.prefill_start_s)
    for v in starts.values():
        v.sort()
    return starts


def ahead(prefills: Sequence[float], r: ShedRecord, until: float = float("inf")) -> int:
    """Prefills (sorted starts) after ``r`` arrived and before its first token (or ever
    after, with none) and before ``until``."""
    end = min(until, r.first_token_s if r.first_token_s is not None else float("inf"))
    return bisect.bisect_left(prefills, end) - bisect.bisect_right(prefills, r.arrival_s)


def measure(records: Sequence[ShedRecord], ttft_s: float, tight: str = "interactive",
            loose: str = "batch") -> dict[str, Any]:
    """The goal's counts: per class requests, shed and their share; of ``tight``'s served
    requests those over ``ttft_s`` (no first token counts as over), split into those with
    ``loose`` work prefilled ahead of them on their instance (of which those with some before
    their deadline), those with only ``loose`` work of unknown instance ahead (maybe), and the
    rest (of which those with other ``tight`` work ahead). The goal is met when the first is 0
    (surely when the maybe ones are 0 too)."""
    by_class: dict[str, dict[str, Any]] = {}
    for r in records:
        c = by_class.setdefault(r.slo_class, {"num_requests": 0, "num_shed": 0})
        c["num_requests"] += 1
        c["num_shed"] += r.is_shed
    for c in by_class.values():
        c["shed_share"] = c["num_shed"] / c["num_requests"]
    batch, own = _prefills(records, loose), _prefills(records, tight)
    every = sorted(t for v in batch.values() for t in v)
    missed = [r for r in records if r.slo_class == tight and not r.is_shed
              and (r.first_token_s is None or r.first_token_s - r.arrival_s > ttft_s)]
    def mine(r: ShedRecord) -> Sequence[float]:
        return batch.get(r.instance_id, ()) if r.instance_id != UNKNOWN else ()

    known = [ahead(mine(r), r) for r in missed]
    maybe = [ahead(batch.get(UNKNOWN, ()) if r.instance_id != UNKNOWN else every, r) for r in missed]
    other = [r for r, k, m in zip(missed, known, maybe, strict=True) if not k and not m]
    num_by, num_maybe = sum(k > 0 for k in known), sum(not k and m > 0 for k, m in zip(known, maybe, strict=True))
    in_time = sum(ahead(mine(r), r, r.arrival_s + ttft_s) > 0 for r in missed)
    return {"classes": by_class, "ttft_s": ttft_s, "num_missed_ttft": len(missed),
            "num_missed_by_batch": num_by, "num_missed_by_batch_before_deadline": in_time,
            "num_missed_maybe_by_batch": num_maybe, "num_missed_other": len(other),
            "num_missed_other_behind_own_class": sum(ahead(own.get(r.instance_id, ()), r) > 0 for r in other),
            "num_batch_prefills_ahead": sum(known), "goal_met": num_by == 0, "goal_met_surely": num_by + num_maybe == 0,
            "goal_met_before_deadline": in_time == 0,
            "num_unknown_instance": sum(r.instance_id == UNKNOWN for r in records if not r.is_shed)}


# -- the simulator: its metrics collector's finished requests and shed counts ------------------
def prefill_instance(final: str, prefill_start: float | None, moves: Sequence[tuple[float, str]]) -> str:
    """Where a request was prefilled: the source of its first committed migration to end
    after its prefill began (``moves``: (end, source), in order), else where it finished."""
    if prefill_start is not None:
        for end, src in moves:
            if end > prefill_start:
                return src
    return final


def records_from_sim(metrics: Any, arrival_times: Sequence[float]) -> list[ShedRecord]:
    """A simulator run's records (``sim.metrics.MetricsCollector``: ``requests`` parallel to
    ``slo_names``, the trace naming each request's class; ``num_shed_by_name``; the committed
    ``migrations``), its trace's arrivals telling each request's id (``req-<i>``)."""
    moves: dict[str, list[tuple[float, str]]] = {}
    for m in sorted((m for m in metrics.migrations if m.committed), key=lambda m: m.end_time):
        moves.setdefault(m.request_id, []).append((m.end_time, m.src_instance_id))
    index = {float(t): i for i, t in enumerate(arrival_times)}
    out = [ShedRecord(c, False, prefill_instance(m.instance_id, m.first_scheduled_time,
                                                 moves.get(f"req-{index[m.arrival_time]}", ())),
                      m.arrival_time, m.first_scheduled_time, m.first_token_time)
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
    start arrival + queue, the first token arrival + ttft; a migrated one's instance unknown.
    ``queue`` runs from the request's arrival at its instance, so the prefill's start is early
    by the dispatch (milliseconds, against TTFT objectives of a second)."""
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
        out.append(ShedRecord(cls, False, inst if num_migrations == "0" else UNKNOWN, arrival,
                              None if q is None else arrival + q, None if t is None else arrival + t))
    return out


def shed_from_client(names: Sequence[str | None], errors: Sequence[str | None]) -> list[ShedRecord]:
    """The client's 429s (``RequestRecord.error`` naming HTTP 429), one record each, by class."""
    return [ShedRecord(n, True) for n, e in zip(names, errors, strict=True)
            if n is not None and e is not None and e.startswith("HTTP 429")]


def real_run(classes: dict[str, dict[str, Any]], names: Sequence[str | None], records: Sequence[Any],
             log_lines: Iterable[str]) -> dict[str, Any] | None:
    """``measure`` of one ``bench cluster --slo-classes`` run: the served requests from its
    gateway's log lines, the shed ones from the client's 429s (``RequestRecord``s parallel to
    ``names``); the tight class the one with the shortest TTFT objective, the loose the
    longest (None: one class)."""
    tight = min(classes, key=lambda c: classes[c]["ttft_s"])
    loose = max(classes, key=lambda c: classes[c]["ttft_s"])
    if tight == loose:
        return None
    recs = records_from_log(log_lines) + shed_from_client(names, [r.error for r in records])
    return {"tight": tight, "loose": loose, **measure(recs, classes[tight]["ttft_s"], tight, loose)}
