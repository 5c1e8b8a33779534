"""How many of the requests the `slo` policy sheds would have met their objectives: shed_goal.py's
simulator runs (1.2x the paced cluster's capacity, classes_shed.yaml: batch may shed 25%), each
run twice on the same trace, with its classes' shed shares and with none; per request id, a shed
request of the first run that met both objectives in the second would have been served in time.

    PYTHONPATH=src nice -n 19 .venv/bin/python benchmarks/slo/shed_would_meet.py --out FILE.json \\
        [--capacity 5.12] [--load 1.2] [--seeds 20,21,22,23,24]

The counterfactual is a whole run without shedding (the other requests' fates change with it),
so its attainment without shedding is reported beside the count.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paced_classes_predict import settings  # noqa: E402
from shed_goal import add_point_args, variants  # noqa: E402

from llumnix.bench.cluster_bench import pace_latency, trace_pairs  # noqa: E402
from llumnix.bench.sim_vs_real import run_sim  # noqa: E402
from llumnix.policy import GlobalScheduler  # noqa: E402
from llumnix.policy.slo_dispatch import RequestShedError  # noqa: E402
from llumnix.sim.metrics import MetricsCollector  # noqa: E402

HERE = Path(__file__).resolve().parent


class Tap:
    def __init__(self) -> None:
        self.shed: dict[str, str] = {}
        """Shed request id -> its class."""
        self.finished: dict[str, Any] = {}
        """Finished request id -> its metrics."""


def install(tap: Tap) -> None:
    dispatch0, outputs0 = GlobalScheduler.dispatch, MetricsCollector.on_outputs

    def dispatch(self: GlobalScheduler, req: Any, now: float) -> Any:
        try:
            return dispatch0(self, req, now)
        except RequestShedError as e:
            tap.shed[req.request_id] = e.slo_class
            raise

    def on_outputs(self: MetricsCollector, outputs: Any, now: float) -> Any:
        done = outputs0(self, outputs, now)
        for out in done:
            tap.finished[out.request_id] = out.metrics
        return done

    GlobalScheduler.dispatch = dispatch  # type: ignore[method-assign]
    MetricsCollector.on_outputs = on_outputs  # type: ignore[method-assign]


def one(tap: Tap, classes: dict[str, Any], rate: float, seed: int, pace: str) -> tuple[dict[str, str], dict[str, bool],
                                                                                        dict[str, str]]:
    """Of one `slo` run: shed ids -> class, finished ids -> met both objectives, every id -> class
    (the simulator names the trace's i-th request req-i)."""
    tap.shed, tap.finished = {}, {}
    s = settings(classes, pace)
    sim, _ = run_sim(s, "slo", trace_pairs(s), s.num_requests, rate, seed, pace_latency(pace))
    names, ids = sim.trace.slo_class_names, sim.trace.slo_class_ids
    cls = {f"req-{i}": str(names[c]) for i, c in enumerate(ids)}
    met = {}
    for rid, m in tap.finished.items():
        obj, tpot = classes[cls[rid]], m.decode_per_token
        met[rid] = m.ttft is not None and m.ttft <= obj["ttft_s"] and (tpot is None or tpot <= obj["tpot_s"])
    return dict(tap.shed), met, cls


def run(tap: Tap, classes: dict[str, Any], rate: float, seed: int, pace: str) -> dict[str, Any]:
    shed, met_with, cls = one(tap, classes, rate, seed, pace)
    _, met_without, _ = one(tap, {k: {**v, "shed_share": 0.0} for k, v in classes.items()}, rate, seed, pace)
    by_class: dict[str, Any] = {}
    for name in classes:
        mine = [i for i, c in shed.items() if c == name]
        members = [i for i, c in cls.items() if c == name]
        by_class[name] = {
            "num": len(members), "num_shed": len(mine),
            "num_shed_would_meet": sum(met_without.get(i, False) for i in mine),
            "attainment_with_shedding": round(sum(met_with.get(i, False) for i in members) / max(1, len(members)), 3),
            "attainment_without_shedding": round(sum(met_without.get(i, False) for i in members)
                                                 / max(1, len(members)), 3)}
    return by_class


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_point_args(ap)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    seeds, rate, t0 = [int(x) for x in a.seeds.split(",")], a.load * a.capacity, time.time()
    tap = Tap()
    install(tap)
    result: dict[str, Any] = {}
    for vname, classes in variants(a.classes).items():
        rows = {str(k): run(tap, classes, rate, k, a.pace) for k in seeds}
        total = {c: {f: sum(r[c][f] for r in rows.values()) for f in ("num", "num_shed", "num_shed_would_meet")}
                 for c in classes}
        for c in classes:
            for f in ("attainment_with_shedding", "attainment_without_shedding"):
                total[c][f] = round(statistics.fmean(r[c][f] for r in rows.values()), 3)
        result[vname] = {"per_seed": rows, "total": total}
        print(vname, json.dumps(total), flush=True)
    a.out.write_text(json.dumps({
        "what": "issue 47: shed requests that would have met without shedding, simulator", "rate_req_s": round(rate, 3),
        "capacity_req_s": a.capacity, "load": a.load, "seeds": seeds, "classes_file": a.classes.name,
        "machine": platform.node(), "loadavg": os.getloadavg(), "wall_s": round(time.time() - t0, 1),
        "variants": result}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
