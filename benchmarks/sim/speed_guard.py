"""Speed guard for the simulator: is ``llumnix simulate`` slower than its committed record?

Run it when you touch ``sim/``, ``policy/``, ``engine/``, ``kv/`` or ``migration/``::

    .venv/bin/python benchmarks/sim/speed_guard.py            # short config, then speed.yaml
    .venv/bin/python benchmarks/sim/speed_guard.py --short    # the short config only (~10 s)

Wall time on a shared machine says little by itself (other jobs take the cores), so
each simulation is timed in CPU seconds (its loop's ``sim.cpu_s``: time another job
holds the core is not counted) and between two runs of a fixed pure-Python reference
workload (heap, dicts, lists, small slotted objects: the simulator's kind of work), also
in CPU seconds. The score is the simulator's events per CPU second divided by the
reference's rounds per CPU second: a slower or busier machine (a shared core's caches,
its clock) slows both alike and leaves the score. The committed record
(``results/speed/guard.json``) holds the scores of the code it was measured on; the
guard prints PASS, or REGRESSED when a score is more than 15% below its record, and
exits 1 then. It also says when a run's number of events differs from the record's
(the work changed: a policy or model change, not a speed change).

``--write-record`` replaces the record with this run's scores (after a change that is
meant to change the work or the speed, with its commit message saying why).
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RECORD = HERE / "results" / "speed" / "guard.json"
CONFIGS = {"short": HERE / "speed_short.yaml", "speed": HERE / "speed.yaml"}
TOLERANCE = 0.15
"""A score more than this fraction below its record is a regression."""


# -- the reference workload ----------------------------------------------------------
@dataclass(slots=True)
class _Item:
    key: str
    size: int
    weight: float


def reference_round(n: int = 2000) -> int:
    """One round of fixed pure-Python work; returns a checksum (so nothing is skipped)."""
    heap: list[tuple[float, int, _Item]] = []
    table: dict[str, _Item] = {}
    total = 0
    for i in range(n):
        item = _Item(f"r{i % 97}", i % 13, (i * 7919 % 1000) / 1000.0)
        table[item.key] = item
        heapq.heappush(heap, (item.weight, i, item))
        if len(heap) > 32:
            total += heapq.heappop(heap)[2].size
    sizes = [it.size for it in table.values() if it.weight < 0.5]
    return total + sum(sizes) + len(table)


def reference_rate(seconds: float = 0.6) -> float:
    """Reference rounds per CPU second: the best of a few short timings over ``seconds``
    of CPU (the best is the least disturbed by other jobs on the cores)."""
    best = float("inf")
    deadline = time.process_time() + seconds
    while True:
        start = time.process_time()
        for _ in range(5):
            reference_round()
        best = min(best, (time.process_time() - start) / 5)
        if time.process_time() > deadline:
            return 1.0 / best


# -- one measurement -----------------------------------------------------------------
def simulate(config: Path, src: Path) -> dict[str, Any]:
    """Run ``llumnix simulate config`` with ``src`` first on the path; its ``sim`` record."""
    with tempfile.TemporaryDirectory(prefix="speed-guard-") as out:
        env = dict(os.environ, PYTHONPATH=str(src))
        subprocess.run([sys.executable, "-m", "llumnix.cli", "simulate", str(config), "--out", out],
                       check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        record = json.loads((Path(out) / "metrics.json").read_text())["records"][0]
    sim: dict[str, Any] = record["sim"]
    if "cpu_s" not in sim:
        raise SystemExit(f"speed_guard: {src} records no sim.cpu_s (code older than the guard)")
    return sim


def measure(name: str, src: Path) -> dict[str, Any]:
    """Events per second of one config between two reference timings, and the score."""
    before = reference_rate()
    sim = simulate(CONFIGS[name], src)
    after = reference_rate()
    ref = (before + after) / 2
    per_cpu_s = sim["num_events"] / sim["cpu_s"]
    return {"config": name, "events_per_s": sim["events_per_s"], "events_per_cpu_s": per_cpu_s,
            "num_events": sim["num_events"], "wall_s": sim["wall_s"], "cpu_s": sim["cpu_s"],
            "reference_per_s": ref, "score": per_cpu_s / ref}


# -- the verdict (pure: tests/bench/test_speed_guard.py) -----------------------------
def verdict(score: float, record_score: float, tolerance: float = TOLERANCE) -> str:
    """PASS, or REGRESSED when ``score`` is more than ``tolerance`` below the record."""
    if record_score <= 0:
        raise ValueError(f"a record score must be positive, got {record_score}")
    return "REGRESSED" if score < record_score * (1.0 - tolerance) else "PASS"


def compare(result: dict[str, Any], record: dict[str, Any], tolerance: float = TOLERANCE) -> tuple[str, str]:
    """(verdict, one line saying why) for one config's measurement against its record."""
    ratio = result["score"] / record["score"]
    word = verdict(result["score"], record["score"], tolerance)
    line = (f"{result['config']}: {result['events_per_cpu_s']:,.0f} events per CPU second "
            f"({result['events_per_s']:,.0f} per wall second), reference "
            f"{result['reference_per_s']:,.0f}/s, score {result['score']:.2f} vs record "
            f"{record['score']:.2f} ({ratio:.0%} of it; regressed below {1 - tolerance:.0%})")
    if result["num_events"] != record["num_events"]:
        line += (f"; the work changed: {result['num_events']:,} events, record "
                 f"{record['num_events']:,}")
    return word, line


def _machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cores": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the short config only")
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree to time (default: this one)")
    ap.add_argument("--write-record", action="store_true", help="store this run's scores as the record")
    args = ap.parse_args(argv)
    names = ["short"] if args.short else ["short", "speed"]
    if args.write_record:
        old = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        old.update({r["config"]: r for r in (measure(n, args.src) for n in names)})
        old["machine"] = _machine()
        RECORD.write_text(json.dumps(old, indent=1) + "\n")
        print(f"record written: {RECORD}")
        return 0
    record = json.loads(RECORD.read_text())
    missing = [n for n in names if n not in record]
    if missing:  # before any run: a missing record is known at once
        print(f"speed_guard: no record for {missing[0]!r} in {RECORD} (run with --write-record)", file=sys.stderr)
        return 2
    worst = "PASS"
    for name in names:
        word, line = compare(measure(name, args.src), record[name])
        print(line, flush=True)
        if word != "PASS":
            worst = word
    print(worst)
    return 0 if worst == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
