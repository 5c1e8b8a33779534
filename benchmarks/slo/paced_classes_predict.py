"""The simulator's prediction of `paced_classes.sh`'s study without the real cluster: the
same settings (`bench cluster`'s trace, sizing and systems, the pace's latency model), at
loads of a given capacity, per class attainment per seed and each system's paired
difference from INFaaS++ (95% bootstrap). It says which points could meet issue 47's
cluster goal (+15 points interactive, batch no lower) before a real study is spent on one.

    PYTHONPATH=src .venv/bin/python benchmarks/slo/paced_classes_predict.py --capacity 5.22 \
        [--loads 0.85,1.0] [--classes benchmarks/slo/classes.yaml ...] --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from llumnix.bench.cluster_bench import ClusterBenchSettings, pace_latency, trace_pairs
from llumnix.bench.cluster_slo import paired_difference, read_classes
from llumnix.bench.sim_vs_real import ATTAINMENT, simulate

HERE = Path(__file__).resolve().parent
SYSTEMS = ("infaas++", "llumnix", "slo")


def settings(classes: dict[str, Any], pace: str) -> ClusterBenchSettings:
    """paced_classes.sh's (paced_scale.sh's sizing)."""
    return ClusterBenchSettings(model=str(Path.home() / ".cache/llumnix/bench/tiny-paced"), trace_tokenizer="smollm2",
                                pace=pace, instances=4, scale=1.0, max_input=512, max_output=512, num_blocks=250,
                                num_requests=128, slo_classes=classes)


def point(s: ClusterBenchSettings, rate: float, seeds: range) -> dict[str, Any]:
    pairs, latency = trace_pairs(s), pace_latency(s.pace or "")
    runs = {n: [simulate(s, n, pairs, s.num_requests, rate, k, latency) for k in seeds] for n in SYSTEMS}
    out: dict[str, Any] = {}
    for n, rs in runs.items():
        row: dict[str, Any] = {"preemptions": [r["num_preemptions"] for r in rs]}
        for c in s.slo_classes:
            mine = [r[f"{ATTAINMENT}{c}"] for r in rs]
            row[c] = {"per_seed": [round(x, 3) for x in mine], "mean": round(statistics.fmean(mine), 3)}
            if n != "infaas++":
                d, lo, hi = paired_difference(mine, [r[f"{ATTAINMENT}{c}"] for r in runs["infaas++"]])
                row[c]["vs_infaas++"] = [round(d, 3), round(lo, 3), round(hi, 3)]
        out[n] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=float, required=True, help="req/s: the cluster's probed capacity")
    ap.add_argument("--loads", default="0.85", help="comma-separated fractions of it")
    ap.add_argument("--classes", nargs="+", default=[str(HERE / "classes.yaml")], help="classes files")
    ap.add_argument("--pace", default="a10-llama7b-serving")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    points = []
    for path in a.classes:
        s = settings(read_classes(path), a.pace)
        for load in (float(x) for x in a.loads.split(",")):
            points.append({"classes": s.slo_classes, "classes_file": Path(path).name, "load": load,
                           "rate_req_s": round(load * a.capacity, 3),
                           "systems": point(s, load * a.capacity,
                                                                                    range(a.first_seed, a.first_seed + a.seeds))})
            inter = {n: r.get("interactive", {}).get("mean") for n, r in points[-1]["systems"].items()}
            print(f"{Path(path).name} load {load}: interactive mean {inter}")
    a.out.write_text(json.dumps({"capacity_req_s": a.capacity, "pace": a.pace, "seeds": a.seeds, "first_seed": a.first_seed,
                                 "loadavg": os.getloadavg(), "points": points}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
