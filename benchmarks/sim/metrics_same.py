"""Are two ``llumnix simulate`` outputs the same run? Field by field, all but timing.

    .venv/bin/python benchmarks/sim/metrics_same.py BEFORE/metrics.json AFTER/metrics.json

A speed change must leave every metric as it was: this compares every record of the
two files (matched by system, trace, rate and seed) in every field but the run's own
timing (``sim.wall_s``, ``sim.events_per_s``, ``sim.cpu_s``) and the machine it ran on,
floats exactly (a simulation is deterministic: the same events give the same bits).
Prints each difference (up to 20) and exits 1 if there is any, else prints how many
records and fields matched and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TIMING = {"wall_s", "events_per_s", "cpu_s"}
"""``sim`` fields that time the run itself (the machine's speed, not the simulation)."""


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return record.get("system"), record.get("trace"), record.get("rate"), record.get("seed")


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (NaN equals NaN; timing fields skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            if path.endswith(".sim") and k in TIMING:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items, then {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diff(x, y, f"{path}[{i}]")]
    if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
        return [f"{path}: {a!r} -> {b!r}"]
    return []


def count_fields(a: Any, path: str = "") -> int:
    """Leaves ``diff`` compares (timing fields not counted)."""
    if isinstance(a, dict):
        return sum(count_fields(v, f"{path}.{k}") for k, v in a.items()
                   if not (path.endswith(".sim") and k in TIMING))
    if isinstance(a, list):
        return sum(count_fields(v, path) for v in a)
    return 1


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], int, int]:
    """(differences, records compared, fields compared) of two metrics files."""
    old = {_key(r): r for r in before["records"]}
    new = {_key(r): r for r in after["records"]}
    out = [f"record {k}: only in {'before' if k in old else 'after'}" for k in sorted(set(old) ^ set(new), key=str)]
    shared = [k for k in old if k in new]
    for k in shared:
        out += [f"record {k}{d}" for d in diff(old[k], new[k])]
    return out, len(shared), sum(count_fields(old[k]) for k in shared)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    diffs, n_records, n_fields = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    for d in diffs[:20]:
        print(d)
    if diffs:
        print(f"DIFFERENT: {len(diffs)} differences")
        return 1
    print(f"IDENTICAL: {n_records} records, {n_fields} fields (timing excepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
