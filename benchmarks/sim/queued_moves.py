"""Which requests make the prefill tail, how often were they moved while queued, and how
much do migrations churn?

For one point of `improvement.yaml` (trace, rate, seed) and each named system, runs the
simulator and looks at the requests in the top 1% of prefill latency (TTFT): how many
migrations each had before its first token, and how many of those moved it while it was
still queued (a queued request moves as metadata: no KV, zero stages). Churn over all
committed migrations: how many requests moved, how often, and how many moves followed the
same request's previous move within 5 s or sent it back where it came from.

    .venv/bin/python benchmarks/sim/queued_moves.py                          # S-L 4.1 seed 0
    .venv/bin/python benchmarks/sim/queued_moves.py S-L 4.1 0 llumnix llumnix-qfit llumnix-stable

Prints a line per system and writes results/queued_moves/metrics.json.
"""
import collections
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from llumnix.bench.machine import machine_info
from llumnix.sim.config import load_config
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.runner import plan
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import make_trace

HERE = Path(__file__).resolve().parent


def _run(args):
    trace_name, rate, seed, system = args
    cfg = load_config(HERE / "improvement.yaml", [f"include_systems=[{system}]"])
    spec = next(s for s in plan(cfg) if s.trace.name == trace_name and s.rate == rate)
    trace = make_trace(spec.trace, spec.rate, seed)
    sim = Simulator(spec.cluster, get_latency_model(spec.latency_model),
                    make_policy(spec.system, spec.cluster, seed=seed), trace)
    out = sim.run()
    # the simulator names request i "req-{i}"; finished metrics carry the arrival time
    ids = {float(t): f"req-{i}" for i, t in enumerate(trace.arrival_times)}
    moves = collections.defaultdict(list)
    for m in sim.metrics.migrations:
        if m.committed:
            moves[m.request_id].append(m)
    reqs = [r for r in sim.metrics.requests if r.ttft is not None]
    cut = float(np.quantile([r.ttft for r in reqs], 0.99))
    top = [r for r in reqs if r.ttft >= cut]
    before = [[m for m in moves.get(ids[r.arrival_time], []) if m.start_time < r.first_token_time] for r in top]
    queued = [sum(1 for m in ms if m.num_stages == 0) for ms in before]
    repeats = quick = back = 0
    for ms in moves.values():
        ms.sort(key=lambda m: m.start_time)
        for a, b in zip(ms, ms[1:], strict=False):
            repeats += 1
            quick += b.start_time - a.end_time < 5.0
            back += b.dst_instance_id == a.src_instance_id
    churn = {"requests_moved": len(moves), "max_moves": max((len(v) for v in moves.values()), default=0),
             "repeat_moves": repeats, "repeat_within_5s": quick, "back_to_previous": back}
    return {"trace": trace_name, "rate": rate, "seed": seed, "system": system, "churn": churn,
            "prefill_p99": out["prefill"]["p99"], "migrations": out["migrations"]["num_committed"],
            "queued_migrations": sum(1 for ms in moves.values() for m in ms if m.num_stages == 0),
            "top1pct": {"count": len(top), "moved_while_queued_share": float(np.mean([q > 0 for q in queued])),
                        "queued_moves_mean": float(np.mean(queued)), "queued_moves_max": int(max(queued)),
                        "prompt_tokens_p50": float(np.median([r.num_prompt_tokens for r in top]))}}


def main() -> None:
    a = sys.argv[1:]
    trace_name, rate, seed = (a[0], float(a[1]), int(a[2])) if len(a) >= 3 else ("S-L", 4.1, 0)
    systems = a[3:] or ["llumnix", "llumnix-qfit", "llumnix-stable"]
    t0 = time.time()
    with ProcessPoolExecutor(2) as pool:
        records = list(pool.map(_run, [(trace_name, rate, seed, s) for s in systems]))
    for r in records:
        t = r["top1pct"]
        print(f"{r['trace']} {r['rate']:g} seed {r['seed']} {r['system']:<13} P99 prefill {r['prefill_p99']:6.2f} s  "
              f"migrations {r['migrations']} ({r['queued_migrations']} of queued requests); top 1%: "
              f"{t['moved_while_queued_share']:.0%} moved while queued, {t['queued_moves_mean']:.2f} moves each "
              f"(max {t['queued_moves_max']}), median prompt {t['prompt_tokens_p50']:g} tokens")
        c = r["churn"]
        print(f"    churn: {c['requests_moved']} requests moved (up to {c['max_moves']} times each); "
              f"{c['repeat_moves']} repeat moves, {c['repeat_within_5s']} within 5 s of the previous, "
              f"{c['back_to_previous']} back where it came from")
    out = HERE / "results" / "queued_moves"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"config": "improvement.yaml", "machine": machine_info(with_torch=False),
                                                 "wall_s": time.time() - t0, "records": records}, indent=1) + "\n")
    print(f"wrote {out / 'metrics.json'}")


if __name__ == "__main__":
    main()
