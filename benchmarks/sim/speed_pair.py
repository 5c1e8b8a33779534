"""Two source trees' simulator speed, paired: alternated runs of one config, medians.

    .venv/bin/python benchmarks/sim/speed_pair.py --base /tmp/base/src --new src \
        --config speed --rounds 3 --out /tmp/speed_pair.json

On a shared machine one run's speed says little (other jobs take the cores and the
caches), so the two trees run alternately (base, new, new, base, ... : each arm goes
first as often as the other), each run measured as ``speed_guard.measure`` does (events
per CPU second of the loop, between two timings of the reference workload), with the
1-minute load average before each run. Prints each run and the medians, spreads and
ratio of both measures; writes the runs as JSON (outside the checkout by default).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_guard import CONFIGS, _machine, measure  # noqa: E402


def order(rounds: int) -> list[str]:
    """Arms in ABBA order: each goes first in half the pairs."""
    return [arm for i in range(rounds) for arm in (("base", "new") if i % 2 == 0 else ("new", "base"))]


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Median, spread and runs of ``key`` per arm, and new's median over base's."""
    out: dict[str, Any] = {}
    for arm in ("base", "new"):
        vals = [r[key] for r in runs if r["arm"] == arm]
        out[arm] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": vals}
    out["ratio"] = out["new"]["median"] / out["base"]["median"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the source tree to compare with")
    ap.add_argument("--new", type=Path, required=True, help="the source tree measured")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="short")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each arm (at least 1)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "speed_pair.json")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    trees = {"base": args.base.resolve(), "new": args.new.resolve()}
    runs = []
    for arm in order(args.rounds):
        load = os.getloadavg()[0]
        run = dict(measure(args.config, trees[arm]), arm=arm, load_avg_1m=round(load, 2))
        runs.append(run)
        print(f"{arm:4} load {load:5.2f}: {run['events_per_cpu_s']:8,.0f} events per CPU second, "
              f"score {run['score']:.2f}", flush=True)
    result = {"config": args.config, "trees": {k: str(v) for k, v in trees.items()}, "machine": _machine(),
              "events_per_cpu_s": summary(runs, "events_per_cpu_s"), "score": summary(runs, "score"), "runs": runs}
    for key in ("events_per_cpu_s", "score"):
        s = result[key]
        print(f"{key}: base {s['base']['median']:,.2f} ({s['base']['min']:,.2f}-{s['base']['max']:,.2f}), "
              f"new {s['new']['median']:,.2f} ({s['new']['min']:,.2f}-{s['new']['max']:,.2f}), "
              f"ratio {s['ratio']:.3f}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
