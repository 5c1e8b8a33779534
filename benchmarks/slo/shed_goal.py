"""Issue 47's shedding goal, first half, in the simulator: at 1.2x the paced cluster's capacity
(paced_classes_predict.py's sizing: 4 paced instances, 250 blocks, 128 requests), with the batch
class allowed to shed (classes_shed.yaml), does any interactive request miss its TTFT objective
because of queued batch work (``llumnix.bench.shed_goal``)? Both classes at one priority (the
file) and at the default priorities (interactive high); `slo` sheds, INFaaS++ and llumnix do not.

    PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/slo/shed_goal.py --out FILE.json \
        [--capacity 5.12] [--load 1.2] [--seeds 20,21,22,23,24] [--classes benchmarks/slo/classes_shed.yaml]

The same measure of a real run (`paced_classes.sh` with these classes; each run's record
carries it, read from its gateway's log): ``--real OUT/cluster.json --out FILE.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paced_classes_predict import settings  # noqa: E402

from llumnix.bench.cluster_bench import pace_latency, trace_pairs  # noqa: E402
from llumnix.bench.cluster_slo import check_classes  # noqa: E402
from llumnix.bench.shed_goal import measure, records_from_sim  # noqa: E402
from llumnix.bench.sim_vs_real import run_sim  # noqa: E402

HERE = Path(__file__).resolve().parent
SYSTEMS = ("slo", "infaas++", "llumnix")


def variants(path: Path) -> dict[str, dict[str, Any]]:
    """The file's classes as written (one priority) and with the interactive class at high."""
    doc = yaml.safe_load(path.read_text())
    high = {k: {**v, "priority": "high"} if k == "interactive" else v for k, v in doc.items()}
    return {"same_priority": check_classes(doc, str(path)), "default_priorities": check_classes(high, str(path))}


def one(classes: dict[str, Any], system: str, rate: float, seed: int, pace: str) -> dict[str, Any]:
    s = settings(classes, pace)
    sim, out = run_sim(s, system, trace_pairs(s), s.num_requests, rate, seed, pace_latency(pace))
    got = measure(records_from_sim(sim.metrics, sim.trace.arrival_times), classes["interactive"]["ttft_s"])
    got["attainment"] = {k: round(float(c["attainment"]), 3) for k, c in out.get("by_slo_class", {}).items()}
    return got


def mean_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("num_missed_ttft", "num_missed_by_batch", "num_missed_by_batch_before_deadline",
            "num_missed_maybe_by_batch", "num_missed_other", "num_missed_other_behind_own_class", "num_batch_prefills_ahead", "num_unknown_instance")
    out: dict[str, Any] = {k: statistics.fmean(r[k] for r in rows) for k in keys}
    out["num_seeds_goal_met"] = sum(r["goal_met"] for r in rows)
    out["num_seeds_goal_met_before_deadline"] = sum(r["goal_met_before_deadline"] for r in rows)
    for c in rows[0]["classes"]:
        out[f"shed_share_{c}"] = statistics.fmean(r["classes"][c]["shed_share"] for r in rows)
        out[f"num_shed_{c}"] = statistics.fmean(r["classes"][c]["num_shed"] for r in rows)
        out[f"attainment_{c}"] = statistics.fmean(r["attainment"].get(c, 0.0) for r in rows)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def real(path: Path) -> dict[str, Any]:
    """A real ``bench cluster --slo-classes`` run's measure (``cluster.json``: each run's
    ``shed_goal``, read from its gateway's log), per system and seed and over the seeds."""
    data = json.loads(path.read_text())
    out: dict[str, Any] = {}
    for sysrec in data["systems"]:
        rows = {str(r["seed"]): {**r["shed_goal"], "attainment": {c: x["attainment"] for c, x in
                                                                  r["by_slo_class"].items()}}
                for r in sysrec["runs"] if r.get("shed_goal")}
        if rows:
            out[sysrec["system"]] = {"per_seed": rows, "mean": mean_of(list(rows.values()))}
            print(f"real {sysrec['system']}: {json.dumps(out[sysrec['system']]['mean'])}")
    return {"what": "issue 47 shedding goal, first half, real cluster", "source": str(path),
            "loadavg_before": data.get("loadavg_before"), "wall_s": data.get("wall_s"), "systems": out}


def add_point_args(ap: argparse.ArgumentParser) -> None:
    """The study's point (capacity, load, seeds, classes, pace): this script's and shed_would_meet.py's."""
    ap.add_argument("--capacity", type=float, default=5.12, help="req/s: the paced cluster's probed capacity")
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--seeds", default="20,21,22,23,24")
    ap.add_argument("--classes", type=Path, default=HERE / "classes_shed.yaml")
    ap.add_argument("--pace", default="a10-llama7b-serving")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_point_args(ap)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--real", type=Path, help="instead: summarize a real run's cluster.json")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.real is not None:
        a.out.write_text(json.dumps(real(a.real), indent=1) + "\n")
        print(f"wrote {a.out}")
        return
    seeds, rate, t0 = [int(x) for x in a.seeds.split(",")], a.load * a.capacity, time.time()
    result: dict[str, Any] = {}
    for vname, classes in variants(a.classes).items():
        for system in a.systems.split(","):
            rows = [one(classes, system, rate, k, a.pace) for k in seeds]
            result.setdefault(vname, {})[system] = {"per_seed": dict(zip(map(str, seeds), rows, strict=True)),
                                                    "mean": mean_of(rows)}
            print(f"{vname} {system}: {json.dumps(result[vname][system]['mean'])}", flush=True)
    a.out.write_text(json.dumps({
        "what": "issue 47 shedding goal, first half, simulator", "capacity_req_s": a.capacity, "load": a.load,
        "rate_req_s": round(rate, 3), "seeds": seeds, "classes_file": a.classes.name, "pace": a.pace,
        "requests_per_run": 128, "instances": 4, "num_blocks": 250, "machine": platform.node(),
        "loadavg": os.getloadavg(), "wall_s": round(time.time() - t0, 1), "variants": result}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
