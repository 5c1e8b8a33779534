"""Statistics of instances' step logs (``InstanceActor.step_log``, kept by
``InstanceServer``): mean step time by batch, the serving loop's gap between steps, and how much
a neighbor instance stepping at the same time slows a step.

A log entry is ``(start, end, num_requests, *extra)`` in monotonic seconds; ``extra`` is
the step thread's CPU seconds and a prefill flag where the log records them.
"""
from __future__ import annotations

import bisect
import statistics
from typing import Any


def step_stats(logs: list[list[tuple[float, ...]]]) -> dict[str, Any]:
    """Per instance step logs -> mean real step time by the number of requests the step
    produced tokens for, and the time between back-to-back steps (the serving loop's own
    work: status reports, output hand-off, commands; gaps over 50 ms are idle time).
    Where the log has the step thread's CPU seconds, also the wall / CPU ratio by batch:
    above 1, the step waited (for the GIL or a core) rather than computed; where it marks
    prefill steps, also the mean of the decode steps alone by batch."""
    by: dict[int, list[float]] = {}
    cpu: dict[int, list[float]] = {}
    decode: dict[int, list[float]] = {}
    gaps: list[float] = []
    busy = 0.0
    for log in logs:
        for prev, step in zip(log, log[1:], strict=False):
            if step[0] - prev[1] < 0.05:
                gaps.append(step[0] - prev[1])
        for start, end, n, *rest in log:
            by.setdefault(int(n), []).append(end - start)
            if rest:
                cpu.setdefault(int(n), []).append(rest[0])
            if len(rest) > 1 and not rest[1]:
                decode.setdefault(int(n), []).append(end - start)
            busy += end - start
    out = {"num_steps": sum(len(v) for v in by.values()), "busy_s": busy,
           "mean_gap_s": statistics.fmean(gaps) if gaps else None,
           "mean_s_by_batch": {str(n): statistics.fmean(v) for n, v in sorted(by.items())},
           "count_by_batch": {str(n): len(v) for n, v in sorted(by.items())}}
    if decode:
        out["decode_mean_s_by_batch"] = {str(n): statistics.fmean(v) for n, v in sorted(decode.items())}
    if cpu:
        out["wall_over_cpu_by_batch"] = {str(n): sum(by[n]) / sum(c) for n, c in sorted(cpu.items()) if sum(c) > 0}
    if len(logs) == 2:
        out["neighbor"] = neighbor_effect(logs)
    return out


def overlap_fraction(step: tuple[float, ...], other: list[tuple[float, ...]], starts: list[float]) -> float:
    """Fraction of ``step``'s wall time during which a step of ``other`` (sorted by start,
    ``starts`` its start times) was running."""
    s, e = step[0], step[1]
    if e <= s:
        return 0.0
    covered = 0.0
    # Steps of one instance do not overlap each other: start from the last one that began before s.
    for o in other[max(0, bisect.bisect_right(starts, s) - 1):]:
        if o[0] >= e:
            break
        covered += max(0.0, min(e, o[1]) - max(s, o[0]))
    return covered / (e - s)


def neighbor_effect(logs: list[list[tuple[float, ...]]], short_s: float = 0.15) -> dict[str, Any]:
    """Real steps of two instances split by what the other instance was doing meanwhile:
    ``alone`` (the other stepped under 10% of the step's time) and ``busy`` (over 90%),
    median wall seconds by batch size, and their ratio where both have 5+ steps. Steps
    longer than ``short_s`` (prefills at these prompt lengths) are left out, so the
    ratio is the decode steps' slowdown from a busy neighbor, what a latency profile's
    ``contention.neighbor_factor.decode`` models."""
    split: dict[str, dict[int, list[float]]] = {"alone": {}, "busy": {}}
    for i in (0, 1):
        other = sorted(logs[1 - i])
        starts = [o[0] for o in other]
        for step in logs[i]:
            dur = step[1] - step[0]
            if dur > short_s:
                continue
            f = overlap_fraction(step, other, starts)
            side = "alone" if f < 0.1 else "busy" if f > 0.9 else None
            if side:
                split[side].setdefault(int(step[2]), []).append(dur)
    out: dict[str, Any] = {k: {str(n): {"median_s": statistics.median(v), "count": len(v)}
                               for n, v in sorted(d.items())} for k, d in split.items()}
    out["ratio_by_batch"] = {str(n): statistics.median(split["busy"][n]) / statistics.median(a)
                             for n, a in sorted(split["alone"].items())
                             if len(a) >= 5 and len(split["busy"].get(n, [])) >= 5}
    return out

