"""Where a migration's downtime goes after its commit (issue 49), for the real engine's
step log and the simulator's alike.

A running request's downtime runs from its pause on the source to the start of the
destination's first step with it (``MigrationReport.downtime``). The part after the
commit is the wait for that step; on a destination's step log (start, end, prefill?)
it splits into::

    commit                                                   resumed
      |--boundary--|--prefill step--|-idle-|--prefill step--|
      (the rest of the step in flight at the commit: the install waits for its boundary)

* ``boundary``: the rest of the step in flight at the commit (``boundary_prefill`` when
  that step was a prefill step);
* ``prefill``: whole steps with prefill work the destination ran after it without the
  request (the paper's engine: a step that admits queued prompts runs no decodes);
* ``decode``: whole decode steps without it (none expected: the request would have
  missed a step it could run in);
* ``idle``: the rest, time between steps (the serving loop's boundary work).

The four add up to the wait. Pure: no Ray, no torch.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

Step = tuple[float, float, bool]
"""(start, end, has prefill work) of one engine step, one clock for all."""

PARTS = ("boundary", "prefill", "decode", "idle")


def split_wait(commit: float, resumed: float, steps: Sequence[Step]) -> dict[str, float]:
    """The wait from ``commit`` to ``resumed`` on a destination whose ``steps`` are sorted
    by start: the parts above, ``boundary_prefill`` (1.0 if the step in flight was a
    prefill step) and ``num_prefill_steps`` (whole prefill steps in the wait)."""
    if resumed < commit:
        raise ValueError(f"resumed ({resumed}) before the commit ({commit})")
    out = {"boundary": 0.0, "prefill": 0.0, "decode": 0.0, "idle": 0.0,
           "boundary_prefill": 0.0, "num_prefill_steps": 0.0}
    i = bisect.bisect_left(steps, (commit, -np.inf, False))
    if i > 0 and steps[i - 1][1] > commit:  # a step in flight at the commit
        out["boundary"] = min(steps[i - 1][1], resumed) - commit
        out["boundary_prefill"] = float(steps[i - 1][2])
    while i < len(steps) and steps[i][0] < resumed:
        start, end, is_prefill = steps[i]
        out["prefill" if is_prefill else "decode"] += min(end, resumed) - start
        out["num_prefill_steps"] += is_prefill
        i += 1
    out["idle"] = max(0.0, (resumed - commit) - out["boundary"] - out["prefill"] - out["decode"])
    return out


def wait_row(paused: float, commit: float, resumed: float, steps: Sequence[Step]) -> dict[str, float]:
    """One committed migration: its downtime, the part before the commit (the last
    stage), the wait after it and the wait's split."""
    return {"downtime": resumed - paused, "before_commit": commit - paused, "wait": resumed - commit,
            **split_wait(commit, resumed, steps)}


def quantiles(xs: Iterable[float]) -> dict[str, float]:
    """n, mean, P50, P90, P99 and max (numpy's linear percentiles); {"n": 0} if empty."""
    a = np.asarray(list(xs), dtype=float)
    if not a.size:
        return {"n": 0}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"n": int(a.size), "mean": float(a.mean()), "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": float(a.max())}


def summarize_waits(rows: Sequence[dict[str, float]], long_s: float = 0.2) -> dict[str, Any]:
    """Distributions of the downtime, the part before the commit, the wait and each part
    of it over ``rows`` (``wait_row``'s), and what the waits over ``long_s`` were made of."""
    out: dict[str, Any] = {key: quantiles(r[key] for r in rows)
                           for key in ("downtime", "before_commit", "wait", *PARTS)}
    long = [r for r in rows if r["wait"] > long_s]
    total = sum(r["wait"] for r in long)
    out["long_waits"] = {
        "over_s": long_s, "num": len(long),
        "behind_a_prefill_in_flight": sum(1 for r in long if r["boundary_prefill"]),
        "with_later_prefill_steps": sum(1 for r in long if r["num_prefill_steps"]),
        "share": {p: (sum(r[p] for r in long) / total if total else 0.0) for p in PARTS}}
    out["num_with_decode_steps_without_it"] = sum(1 for r in rows if r["decode"] > 0)
    return out


def ratios(sim: dict[str, Any], real: dict[str, Any], keys: Sequence[str] = ("wait", "downtime"),
           stats: Sequence[str] = ("p50", "p99")) -> dict[str, float | None]:
    """sim / real of each key's statistics (None where real is 0 or missing)."""
    out: dict[str, float | None] = {}
    for k in keys:
        for s in stats:
            a, b = sim.get(k, {}).get(s), real.get(k, {}).get(s)
            out[f"{k}_{s}"] = None if a is None or not b else a / b
    return out
