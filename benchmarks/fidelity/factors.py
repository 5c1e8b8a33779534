"""What the probes and a real run's steps say about the machine: the factors a
simulation of that run is given (prefill speed, neighbor factors, the serving loop's
gap between steps)."""
from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from llumnix.bench.step_log import overlap_fraction


def prefill_split(logs: list[list[tuple[float, ...]]]) -> dict[str, Any]:
    """One-request prefill steps of two instances (logs with a prefill flag) split by what
    the other instance did meanwhile: ``alone`` (stepping under 10% of the time) or
    ``busy`` (over 90%); durations in seconds, and the medians and their ratio where each
    side has 2 or more."""
    out: dict[str, Any] = {"alone": [], "busy": []}
    for i in (0, 1):
        other = sorted(logs[1 - i])
        starts = [o[0] for o in other]
        for step in logs[i]:
            if not step[3] or step[2] != 1:
                continue
            f = overlap_fraction(step, other, starts)
            side = "alone" if f < 0.1 else "busy" if f > 0.9 else None
            if side:
                out[side].append(step[1] - step[0])
    for side in ("alone", "busy"):
        out[f"{side}_median_s"] = statistics.median(out[side]) if len(out[side]) >= 2 else None
    a, b = out["alone_median_s"], out["busy_median_s"]
    out["ratio"] = b / a if a and b else None
    return out


def cluster_prefill(probe: dict[str, Any], model: Any) -> tuple[float, float] | None:
    """(prefill speed of the cluster alone / the profile's, prefill neighbor factor) from
    a ``probe_prefill``; None where the probe lacks either side."""
    if not probe or not probe.get("ratio") or not probe.get("alone_median_s"):
        return None
    return probe["alone_median_s"] / model.prefill_time([int(probe["prompt_tokens"])]), float(probe["ratio"])


def step_gap(probe: dict[str, Any]) -> float | None:
    """Median time between back-to-back steps of one instance in the step probe (taken
    on the idle cluster before the trace): the serving loop's own work per step. Gaps
    of 50 ms or more are idle time, not loop work."""
    gaps = [b[0] - a[1] for p in probe.values() for log in p.get("log", [])
            for a, b in zip(log, log[1:], strict=False) if 0 <= b[0] - a[1] < 0.05]
    return statistics.median(gaps) if gaps else None


def contention_scale(probe: dict[str, Any], model: Any) -> float | None:
    """Geometric mean over the probe's points of measured / profiled decode step time.
    Both instances step at once in the probe, so the profiled time includes the model's
    neighbor factor for decode (1 when it has none)."""
    ratios = [p["median_s"] / (model.contention.decode * model.decode_time(int(n), int(p["context_tokens"])))
              for n, p in probe.items() if p.get("median_s")]
    if not ratios:
        return None
    return float(np.exp(np.mean(np.log(ratios))))



def prefill_scale(real: dict[str, Any], trace: Any, model: Any) -> float | None:
    """How much slower the run's prefill steps were than the profile's, like for like: the
    median over requests of the measured first-prefill step (engine timing) over the
    profile's prefill of that prompt. Only prefill steps, whose cost the load does not
    change (a decode step's does: a slower machine holds more requests per batch)."""
    b = real.get("ttft_breakdown") or {}
    if not b.get("prefill_s"):
        return None
    values = b["prefill_s"]["values"]
    index = (b.get("index") or {}).get("values") or list(range(len(values)))
    if len(index) != len(values):
        return None
    ratios = [v / model.prefill_time([int(trace.prompt_lens[i])]) for i, v in zip(index, values, strict=True)]
    return float(statistics.median(ratios))

