"""Pool the co-running slowdown of `llumnix bench migration` runs, grouped by a label.

    .venv/bin/llumnix bench migration --transport tcp --repeats 6 --no-bulk-idle --out DIR_A
    .venv/bin/llumnix bench migration --transport tcp --repeats 6 --bulk-idle --out DIR_B
    .venv/bin/python benchmarks/migration_ab.py benchmarks/results/migration-bulk-idle-ab

Reads ``LABEL-N.json`` files (each a copy of one run's ``migration.json``) and writes
``DIR.json`` beside the folder: per label, the slowdown ratios of every live tcp
migration (source and destination side) and of the no-migration control windows,
pooled over its runs, with their median, quartiles and mean, and each run's own floors.

The committed folder holds runs made one after another on one machine: nice-1,
idle-1, idle-2, nice-2 (ABBA, tcp only), idle-3 (the full three-transport run that is
also benchmarks/results/migration.json), nice-3, idle-4, idle-5 (instances without
gc.freeze, LLUMNIX_GC_FREEZE=0), idle-6 (with it, the default).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _summary(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4)
    return {"n": len(xs), "median": statistics.median(xs) - 1, "q1": q[0] - 1, "q3": q[2] - 1,
            "mean": statistics.mean(xs) - 1}


def pool(folder: Path) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*-*.json")):
        groups[path.stem.rsplit("-", 1)[0]].append(json.loads(path.read_text()))
    out: dict[str, Any] = {}
    for label, runs in groups.items():
        slow, ctrl = [], []
        for run in runs:
            for row in run["rows"]:
                if row["mode"] != "live" or not row["committed"] or row["transport"] != "tcp":
                    continue
                for side in ("src", "dst"):
                    if row[f"{side}_slowdown"] is not None:
                        slow.append(row[f"{side}_slowdown"])
                    if row[f"{side}_control"] is not None:
                        ctrl.append(row[f"{side}_control"])
        out[label] = {"runs": len(runs), "per_run_median": [r["floors"]["tcp"]["co_running_slowdown_median"] for r in runs], "co_running_slowdown": _summary(slow), "control_no_migration": _summary(ctrl),
                      "settings": [r["settings"] for r in runs], "machine": [r["machine"] for r in runs],
                      "per_run_floors": [r["floors"]["tcp"] for r in runs]}
    return out


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/migration-bulk-idle-ab")
    result = pool(folder)
    folder.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    for label, r in result.items():
        s, c = r["co_running_slowdown"], r["control_no_migration"]
        print(f"{label:>8}: {r['runs']} runs, {s['n']} windows: slowdown median {s['median']:+.1%} "
              f"(IQR {s['q1']:+.1%}..{s['q3']:+.1%}, mean {s['mean']:+.1%}); "
              f"control median {c['median']:+.1%} (mean {c['mean']:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
