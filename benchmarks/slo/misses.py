"""Why requests miss their objectives in one run of issue 47's goal (``goal.yaml``): per
class, the misses by objective (TTFT, TPOT or both), a TTFT miss's wait split into its queue
time (arrival to first admission) and the rest (prefill, and re-prefill after a preemption),
how many were preempted or migrated, how many arrived in a burst (more requests in the 10 s
before them than the trace's rate brings), and per 10 s window of arrivals the requests and
their misses (where in the run they fall).

    PYTHONPATH=src .venv/bin/python benchmarks/slo/misses.py --system slo --seed 0 --rate 24 \\
        [--system llumnix ...] [--out misses.json]
"""
from __future__ import annotations

import argparse
import bisect
import json
import statistics
from pathlib import Path
from typing import Any

from llumnix.sim.config import load_config
from llumnix.sim.runner import make_simulator, plan

HERE = Path(__file__).resolve().parent
WINDOW_S = 10.0


def _pcts(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    return {"p50": round(xs[len(xs) // 2], 3), "p90": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "max": round(xs[-1], 3)}


def classify(sim: Any) -> dict[str, Any]:
    """The run's misses, from its finished requests' metrics and their trace classes."""
    slo = sim.metrics.slo_classes
    arrivals = sorted(r.arrival_time for r in sim.metrics.requests)
    rate = len(arrivals) / max(1e-9, arrivals[-1] - arrivals[0])
    out: dict[str, Any] = {}
    windows: dict[int, list[int]] = {}
    names = sim.metrics.slo_names or [None] * len(sim.metrics.requests)  # the classes the trace named
    for r, c, name in zip(sim.metrics.requests, sim.metrics.classes, names, strict=True):
        cls = slo.for_priority(c) if name is None else slo.get(name)
        d = out.setdefault(cls.name, {"num": 0, "met": 0, "ttft_only": 0, "tpot_only": 0, "both": 0,
                                      "preempted": 0, "migrated": 0, "in_burst": 0,
                                      "_queue": [], "_rest": [], "_tpot": []})
        d["num"] += 1
        w = windows.setdefault(int(r.arrival_time // WINDOW_S), [0, 0])
        w[0] += 1
        ttft_miss = r.ttft is None or r.ttft > cls.ttft_s
        tpot = r.decode_per_token
        tpot_miss = tpot is not None and tpot > cls.tpot_s
        if not ttft_miss and not tpot_miss:
            d["met"] += 1
            continue
        w[1] += 1
        d["both" if ttft_miss and tpot_miss else "ttft_only" if ttft_miss else "tpot_only"] += 1
        d["preempted"] += r.num_preemptions > 0
        d["migrated"] += r.num_migrations > 0
        before = bisect.bisect_left(arrivals, r.arrival_time) - bisect.bisect_left(arrivals, r.arrival_time - WINDOW_S)
        d["in_burst"] += before > rate * WINDOW_S
        if ttft_miss and r.ttft is not None and r.queue_time is not None:
            d["_queue"].append(r.queue_time)
            d["_rest"].append(r.ttft - r.queue_time)
        if tpot_miss:
            d["_tpot"].append(tpot)
    for d in out.values():
        d["attainment"] = round(d["met"] / d["num"], 4)
        d["ttft_miss_queue_s"] = _pcts(d.pop("_queue"))
        d["ttft_miss_rest_s"] = _pcts(d.pop("_rest"))
        d["tpot_miss_s"] = _pcts(d.pop("_tpot"))
    out["windows"] = {f"{k * WINDOW_S:g}": v for k, v in sorted(windows.items())}
    out["num_preemptions"] = sum(i.engine.scheduler.num_preemptions for i in sim.cluster.instances.values())
    out["num_overdue"] = sum(i.engine.scheduler.num_overdue for i in sim.cluster.instances.values())
    out["mean_rate"] = round(rate, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", action="append", required=True, help="a system of goal.yaml (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    cfg = load_config(HERE / "goal.yaml", args.overrides)
    runs = {(r.system.name, r.rate, r.seed): r for r in plan(cfg, args.seed + 1)}
    result: dict[str, Any] = {"rate": args.rate, "seed": args.seed, "overrides": args.overrides, "systems": {}}
    for name in args.system:
        spec = runs.get((name, args.rate, args.seed))
        if spec is None:
            ap.error(f"goal.yaml has no run {name} at {args.rate:g} req/s (its rates and systems)")
        sim = make_simulator(spec)
        sim.run()
        result["systems"][name] = classify(sim)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    for name, v in result["systems"].items():
        att = {k: v[k]["attainment"] for k in v if isinstance(v[k], dict) and "attainment" in v[k]}
        print(name, att, "preemptions", v["num_preemptions"], "overdue", v["num_overdue"],
              "median window misses", statistics.median(w[1] for w in v["windows"].values()))


if __name__ == "__main__":
    main()
