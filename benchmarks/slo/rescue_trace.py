"""Rescue by migration request by request, in one run of issue 47's goal (``goal.yaml``): each
rescue order (the request it names: TTFT a queued one, TPOT the one the selection rule picked),
where the moved request stood in the destination's queue when it arrived there, whether it
then met its objectives, how many running requests the destination preempted for first
tokens around the move, and how the requests queued at the destination when it arrived
fared against the same run without rescue (``--compare``: the same trace and seed).

    PYTHONPATH=src .venv/bin/python benchmarks/slo/rescue_trace.py --seed 0 --rate 40 \\
        [--system slo] [--set systems.slo.slo.rescue_rule=...] [--out trace.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from llumnix.sim.config import load_config
from llumnix.sim.runner import make_simulator, plan

HERE = Path(__file__).resolve().parent


def _met(m: Any, cls: Any) -> bool:
    return bool(cls.is_met(m.ttft, m.decode_per_token))


def traced_run(spec: Any) -> dict[str, Any]:
    """Run ``spec`` and return per request its metrics and class, and every rescue move."""
    sim = make_simulator(spec)
    bridge = sim.policy
    moves: list[dict[str, Any]] = []
    done: dict[str, Any] = {}
    pair = bridge.pair_migrations

    def pair_logged() -> list[tuple[str, str]]:
        out = pair()
        now = bridge._now()
        for (src, dst), rid in bridge._named.items():
            st = sim.cluster.instances[dst].engine.scheduler
            moves.append({"t": now, "request_id": rid, "src": src, "dst": dst,
                          "dst_queue": [r.request_id for r in st.waiting],
                          "dst_preempted_for_deadlines": st.num_preempted_for_deadlines})
        return out

    bridge.pair_migrations = pair_logged  # type: ignore[method-assign]
    on_outputs = sim.metrics.on_outputs

    def outputs_logged(outputs: list[Any], now: float) -> list[Any]:
        fin = on_outputs(outputs, now)
        for o in fin:
            done[o.request_id] = o.metrics
        return fin

    sim.metrics.on_outputs = outputs_logged  # type: ignore[method-assign]
    summary = sim.run()
    slo = sim.metrics.slo_classes
    named = sim._slo_names  # the classes the trace names (None: each request is its priority's)
    classes = {f"req-{i}": slo.for_priority(int(p)) if named is None else slo.get(named[i])
               for i, p in enumerate(sim.trace.priorities)}
    pre_end = {i.instance_id: i.engine.scheduler.num_preempted_for_deadlines for i in sim.cluster.instances.values()}
    return {"sim": sim, "summary": summary, "moves": moves, "done": done, "classes": classes, "pre_end": pre_end}


def analyse(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    done, classes = run["done"], run["classes"]
    moved = [m for m in run["moves"] if m["request_id"] in done]
    met_moved = sum(_met(done[m["request_id"]], classes[m["request_id"]]) for m in moved)
    out: dict[str, Any] = {"num_rescue_moves": len(run["moves"]), "num_moved_finished": len(moved),
                           "moved_met": met_moved,
                           "by_class": {}}
    for m in moved:
        c = classes[m["request_id"]].name
        d = out["by_class"].setdefault(c, [0, 0])
        d[0] += 1
        d[1] += _met(done[m["request_id"]], classes[m["request_id"]])
    # the destination's queued requests at the move: met here, and in the run without rescue
    if base is not None:
        hurt = helped = same = 0
        seen: set[str] = set()
        for m in moved:
            for rid in m["dst_queue"]:
                if rid in seen or rid not in done or rid not in base["done"]:
                    continue
                seen.add(rid)
                a, b = _met(done[rid], classes[rid]), _met(base["done"][rid], classes[rid])
                hurt += b and not a
                helped += a and not b
                same += a == b
        out["dst_queued_vs_no_rescue"] = {"hurt": hurt, "helped": helped, "same": same}
        mv_hurt = mv_helped = 0
        for m in moved:
            rid = m["request_id"]
            if rid in base["done"]:
                a, b = _met(done[rid], classes[rid]), _met(base["done"][rid], classes[rid])
                mv_hurt += b and not a
                mv_helped += a and not b
        out["moved_vs_no_rescue"] = {"hurt": mv_hurt, "helped": mv_helped}
        out["met_by_class"] = {}
        for name in {c.name for c in classes.values()}:
            ids = [r for r in done if classes[r].name == name and r in base["done"]]
            out["met_by_class"][name] = {"rescue": sum(_met(done[r], classes[r]) for r in ids),
                                         "no_rescue": sum(_met(base["done"][r], classes[r]) for r in ids),
                                         "of": len(ids)}
    waits = [done[m["request_id"]].ttft for m in moved if done[m["request_id"]].ttft is not None]
    out["moved_ttft_p50_s"] = round(statistics.median(waits), 3) if waits else None
    out["preempted_for_deadlines"] = sum(run["pre_end"].values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="slo")
    ap.add_argument("--compare", default="slo-no-rescue", help="the same run without rescue ('' : none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out")
    a = ap.parse_args()
    cfg = load_config(HERE / "goal.yaml", a.overrides)
    runs = {(r.system.name, r.rate, r.seed): r for r in plan(cfg, a.seed + 1)}
    run = traced_run(runs[(a.system, a.rate, a.seed)])
    base = traced_run(runs[(a.compare, a.rate, a.seed)]) if a.compare else None
    result = {"system": a.system, "seed": a.seed, "rate": a.rate, "overrides": a.overrides,
              **analyse(run, base),
              "by_slo_class": {k: v["attainment"] for k, v in run["summary"]["by_slo_class"].items()}}
    if base is not None:
        result["base_by_slo_class"] = {k: v["attainment"] for k, v in base["summary"]["by_slo_class"].items()}
        result["base_preempted_for_deadlines"] = sum(base["pre_end"].values())
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
