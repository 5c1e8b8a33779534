"""``bench cluster --trace``: each preemption of a run attributed from the engine trace
(``engine_trace.py``): on which instance, whether the victim had migrated in, how long
before the instance last received a migrated request, what it held then.

    victim_migrated     the preempted request had been installed by a migration
    after_install_s     seconds since the instance's latest migration in (None: none)
    recent_install      that latest migration in was within ``window_s``
    recent_victim       ... and the victim is that request itself
    free / waiting      the instance's free blocks and queue as it preempted
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

WINDOW_S = 5.0
"""A preemption within this many seconds of a migration into its instance counts as after
one (about 10-50 decode steps on this CPU: the time a moved request grows 1-3 blocks)."""


def attribute(events: list[dict[str, Any]], samples: list[dict[str, Any]] | None = None,
              window_s: float = WINDOW_S) -> dict[str, Any]:
    """Every ``preempt`` event of ``events`` (time-ordered), with the instance's latest
    ``install`` before it and the other instances as the latest of ``samples`` (polled
    ``/admin/cluster``, ``t`` on the events' clock) before it showed them; and a summary."""
    samples = sorted(samples or (), key=lambda x: x["t"])
    last_install: dict[str, dict[str, Any]] = {}
    installed: set[str] = set()
    out = []
    for e in events:
        if e["ev"] == "install":
            last_install[e["iid"]] = e
            installed.add(e["rid"])
        elif e["ev"] == "preempt":
            li = last_install.get(e["iid"])
            dt = None if li is None else e["t"] - li["t"]
            out.append({"t": e["t"], "iid": e["iid"], "rid": e["rid"], "tokens": e["tokens"],
                        "outputs": e["outputs"], "victim_migrated": e["migrations"] > 0 or e["rid"] in installed,
                        "after_install_s": dt, "recent_install": dt is not None and dt <= window_s,
                        "recent_victim": dt is not None and dt <= window_s and li is not None
                        and li["rid"] == e["rid"], "free": e["free"], "used": e["used"],
                        "running": e["running"], "waiting": e["waiting"], **_others(e, samples)})
    return {"preemptions": out, "summary": summarize(out, events)}


def _others(e: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The other instances' free blocks, queue and freeness in the latest sample before
    ``e``; ``other_could_take``: one of them had the blocks the victim held (a move, or a
    dispatch elsewhere, could have spared it)."""
    before = [x for x in samples if x["t"] <= e["t"]]
    if not before:
        return {"other_free": None, "other_waiting": None, "other_freeness": None, "other_could_take": None}
    others = [i for i in before[-1]["instances"] if i.get("instance_id") != e["iid"]]
    free = [(i.get("num_total_blocks") or 0) - (i.get("num_used_blocks") or 0) for i in others]
    best = max(free, default=0)
    return {"other_free": best, "other_waiting": sum(i.get("num_waiting") or 0 for i in others),
            "other_freeness": max((i.get("freeness") for i in others if i.get("freeness") is not None),
                                  default=None),
            "other_could_take": best >= e["victim_blocks"]}


def summarize(pre: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    installs = [e for e in events if e["ev"] == "install"]
    victims = Counter(p["rid"] for p in pre)
    dts = [p["after_install_s"] for p in pre if p["after_install_s"] is not None]
    return {"num_preemptions": len(pre), "by_instance": dict(Counter(p["iid"] for p in pre)),
            "victim_migrated": sum(p["victim_migrated"] for p in pre),
            "after_recent_install": sum(p["recent_install"] for p in pre),
            "victim_is_recent_install": sum(p["recent_victim"] for p in pre),
            "after_install_s_median": statistics.median(dts) if dts else None,
            "distinct_victims": len(victims), "repeat_preemptions": sum(n - 1 for n in victims.values()),
            "installs": len(installs), "installs_running": sum(not e["queued"] for e in installs),
            "running_mean": statistics.fmean(p["running"] for p in pre) if pre else None,
            "other_free_median": _median([p["other_free"] for p in pre]),
            "other_could_take": sum(bool(p["other_could_take"]) for p in pre),
            "waiting_mean": statistics.fmean(p["waiting"] for p in pre) if pre else None}


def _median(xs: list[Any]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None
