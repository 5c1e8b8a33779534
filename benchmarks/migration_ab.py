"""Pool the co-running slowdown of `llumnix bench migration` runs, grouped by a label.

    .venv/bin/llumnix bench migration --transport tcp --repeats 6 --no-bulk-idle --out DIR_A
    .venv/bin/llumnix bench migration --transport tcp --repeats 6 --bulk-idle --out DIR_B
    .venv/bin/python benchmarks/migration_ab.py benchmarks/results/migration-bulk-idle-ab

Reads ``LABEL-N.json`` files (each a copy of one run's ``migration.json``) and writes
``DIR.json`` beside the folder: per label, the slowdown ratios of every live tcp
migration (source and destination side) and of the no-migration control windows,
pooled over its runs, with their median, quartiles and mean, and each run's own floors.

benchmarks/results/migration-bulk-idle-ab holds runs made one after another on one
machine: nice-1, idle-1, idle-2, nice-2 (ABBA, tcp only), idle-3 (a full
three-transport run), nice-3, idle-4, idle-5 (instances without gc.freeze,
LLUMNIX_GC_FREEZE=0), idle-6 (with it, the default). Those runs predate the
benchmark's step-time estimator: their ``*_slowdown`` is the plain mean of the steps
overlapping each window, and their control compares two equal 2.5 s windows.

benchmarks/results/migration-gil-ab holds the runs of the GIL work, with the
step-time estimator, matched controls and each step's thread CPU time: pyio-1 and
pyio-2 (the TCP transport calling recv_into / sendall per view, Python-level
timeouts, freed blocks reallocated in reverse), kernel-1 (kernel timeouts and
MSG_WAITALL only), vectored-1 and vectored-2 (sendmsg / recvmsg_into and ascending
reallocation too, the committed code; vectored-2 is the tcp part of the full run in
benchmarks/results/migration.json). Where rows carry their steps, the pooled result
also has the co-running steps' wall time over their thread CPU time before and during
each copy: a rise with no rise in CPU per step is waiting (for the GIL or a core).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from llumnix.bench.machine import write_result


def _summary(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4)
    return {"n": len(xs), "median": statistics.median(xs) - 1, "q1": q[0] - 1, "q3": q[2] - 1,
            "mean": statistics.mean(xs) - 1}


def _wall_over_cpu(row: dict[str, Any], side: str) -> tuple[float, float] | None:
    """Mean wall / CPU time of the co-running steps wholly inside the 2.5 s before the
    copy and wholly inside the copy (source: up to the pause; destination: the commit)."""
    steps = [s for s in row.get(f"{side}_steps") or [] if len(s) > 3 and s[2] > 0 and s[3] > 0]
    hi = row["duration_s"] - (row["downtime_s"] or 0) if side == "src" else row["duration_s"]
    before = [(e - s) / c for s, e, _, c in steps if s >= -2.5 and e <= 0]
    during = [(e - s) / c for s, e, _, c in steps if s >= 0 and e <= hi]
    if not before or not during:
        return None
    return statistics.mean(before), statistics.mean(during)


def pool(folder: Path) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*-*.json")):
        groups[path.stem.rsplit("-", 1)[0]].append(json.loads(path.read_text()))
    out: dict[str, Any] = {}
    for label, runs in groups.items():
        slow, ctrl, cpu, slow_overlap = [], [], [], []
        wall_cpu_before: list[float] = []
        wall_cpu_during: list[float] = []
        for run in runs:
            for row in run["rows"]:
                if row["mode"] != "live" or not row["committed"] or row["transport"] != "tcp":
                    continue
                for side in ("src", "dst"):
                    if row[f"{side}_slowdown"] is not None:
                        slow.append(row[f"{side}_slowdown"])
                    if row[f"{side}_control"] is not None:
                        ctrl.append(row[f"{side}_control"])
                    if row.get(f"{side}_slowdown_overlap") is not None:
                        slow_overlap.append(row[f"{side}_slowdown_overlap"])
                    if row.get(f"{side}_step_cpu_ratio") is not None:
                        cpu.append(row[f"{side}_step_cpu_ratio"])
                    waits = _wall_over_cpu(row, side)
                    if waits is not None:
                        wall_cpu_before.append(waits[0])
                        wall_cpu_during.append(waits[1])
        out[label] = {"runs": len(runs), "per_run_median": [r["floors"]["tcp"]["co_running_slowdown_median"] for r in runs], "co_running_slowdown": _summary(slow), "control_no_migration": _summary(ctrl),
                      "settings": [r["settings"] for r in runs], "machine": [r["machine"] for r in runs],
                      "per_run_floors": [r["floors"]["tcp"] for r in runs]}
        down: dict[int, list[float]] = defaultdict(list)
        for run in runs:
            for row in run["rows"]:
                if row["mode"] == "live" and row["committed"] and row["transport"] == "tcp":
                    down[row["length"]].append(row["downtime_s"])
        med = {n: statistics.median(v) for n, v in sorted(down.items())}
        out[label]["downtime_median_s"] = med
        out[label]["downtime_ratio_longest_over_shortest"] = med[max(med)] / med[min(med)]
        if slow_overlap:  # the same windows by the earlier estimator, for comparison
            out[label]["co_running_slowdown_overlap_mean"] = _summary(slow_overlap)
        if cpu:
            out[label]["step_cpu_during_over_before"] = _summary(cpu)
            out[label]["wall_over_cpu_median"] = {"before": statistics.median(wall_cpu_before),
                                                  "during": statistics.median(wall_cpu_during)}
    return out


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/migration-bulk-idle-ab")
    result = pool(folder)
    write_result(folder.with_suffix(".json"), result, quiet=True)
    for label, r in result.items():
        s, c = r["co_running_slowdown"], r["control_no_migration"]
        print(f"{label:>8}: {r['runs']} runs, {s['n']} windows: slowdown median {s['median']:+.1%} "
              f"(IQR {s['q1']:+.1%}..{s['q3']:+.1%}, mean {s['mean']:+.1%}); "
              f"control median {c['median']:+.1%} (mean {c['mean']:+.1%}); downtime ms by length "
              f"{', '.join(f'{1000 * v:.1f}' for v in r['downtime_median_s'].values())} "
              f"(ratio {r['downtime_ratio_longest_over_shortest']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
