"""Where a run's long inter-token gaps come from (issue 33): one seed of ``run.py``'s
workload on one system, every streamed token's time kept per request, and each long gap
(over ``--long`` x the run's median gap) placed in its request's stream: the token it
follows (1 = the gap after the first token) and how many of that request's gaps before
it were long too. A request that keeps decoding on the prefill instance beside prompt
chunks shows a run of long gaps right after its first token; the decode instance's own
slow steps show as long gaps anywhere in the stream, at the same instant for many requests.

    python benchmarks/pd_cluster/trace.py [--system pd] [--seed 1] [--rate 0.29] [--out DIR]

Writes ``DIR/trace_SYSTEM_SEED.json`` (default ``./llumnix-results/pd_cluster``).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from run import SYSTEMS, WORKLOAD, Serve  # noqa: E402 - this folder's script, not a package

from llumnix.bench.machine import RESULTS_DIR, machine_info, write_result  # noqa: E402
from llumnix.bench.serve_bench import plan, run_load, summarize  # noqa: E402


def place_gaps(records: list[Any], long_x: float) -> dict[str, Any]:
    """Each request's long gaps, by the token they follow, and the absolute instants."""
    gaps = [g for r in records for g in r.itl_s]
    med = statistics.median(gaps) if gaps else 0.0
    per_request, early, late = [], 0, 0
    for i, r in enumerate(records):
        if r.ttft_s is None:
            continue
        t = r.arrival_s + r.ttft_s
        longs = []
        for k, g in enumerate(r.itl_s, start=1):
            t += g
            if g > long_x * med:
                longs.append({"after_token": k, "gap_s": round(g, 3), "at_s": round(t, 3)})
        # a run of long gaps from the first token on: decoding beside prompt chunks before the hand-off
        lead = next((j for j, x in enumerate(longs) if x["after_token"] != j + 1), len(longs))
        early += lead
        late += len(longs) - lead
        per_request.append({"index": i, "arrival_s": round(r.arrival_s, 3), "ttft_s": round(r.ttft_s, 3),
                            "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_output_tokens,
                            "num_long_gaps_from_first_token": lead, "long_gaps": longs})
    return {"median_gap_s": med, "long_over_s": long_x * med, "num_gaps": len(gaps),
            "num_long_from_first_token": early, "num_long_later": late, "requests": per_request}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="pd", choices=sorted(SYSTEMS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=0.29, help="requests per second (Poisson)")
    ap.add_argument("--num-requests", type=int, default=WORKLOAD["num_requests"])
    ap.add_argument("--long", type=float, default=2.5, help="a gap over this x the run's median gap is long")
    ap.add_argument("--out", default=f"{RESULTS_DIR}/pd_cluster")
    args = ap.parse_args()
    reqs = plan(args.num_requests, args.rate, WORKLOAD["arrival"], WORKLOAD["cv"], WORKLOAD["lengths"],
                WORKLOAD["input_len"], WORKLOAD["output_len"], WORKLOAD["max_input"], WORKLOAD["max_output"],
                args.seed)
    with Serve(f"trace-{args.system}", SYSTEMS[args.system]) as srv:
        load0 = os.getloadavg()[0]
        records, duration = asyncio.run(run_load(srv.url, srv.model(), reqs, show_progress=False))
        info = srv.cluster()
    pd, instances = info.get("pd") or {}, info.get("instances") or []
    s = summarize(records, duration)
    for i in instances:
        print(f"  {i.get('instance_id')} ({i.get('role')}): preemptions {i.get('num_preemptions')}, "
              f"blocks {i.get('num_total_blocks')}")
    placed = place_gaps(records, args.long)
    print(f"{args.system} seed {args.seed}: ITL p50 {s['itl_s']['p50']:.3f} p99 {s['itl_s']['p99']:.3f} "
          f"TTFT p99 {s['ttft_s']['p99']:.3f}  load {load0:.1f}-{os.getloadavg()[0]:.1f}")
    print(f"long gaps (> {placed['long_over_s']:.3f} s): {placed['num_long_from_first_token']} in runs from the "
          f"first token, {placed['num_long_later']} later, of {placed['num_gaps']} gaps")
    for r in placed["requests"]:
        if r["long_gaps"]:
            print(f"  req {r['index']:2d} prompt {r['num_prompt_tokens']:4d} arr {r['arrival_s']:6.2f} "
                  f"ttft {r['ttft_s']:5.2f}: " + " ".join(f"{x['after_token']}:{x['gap_s']:.2f}@{x['at_s']:.1f}"
                                                          for x in r["long_gaps"]))
    result = {"machine": machine_info(with_torch=False), "system": args.system, "seed": args.seed,
              "rate_req_s": args.rate, "load_avg_1m": [load0, os.getloadavg()[0]], "summary": s,
              "gaps": placed, "pd": {k: pd.get(k) for k in ("handoffs_done", "handoffs_failed", "handoffs_waiting",
                                                            "handoff_downtime_s", "handoffs_recent")},
              "instances": instances,
              "itl_s": [r.itl_s for r in records], "time": time.time()}
    write_result(Path(args.out) / f"trace_{args.system}_{args.seed}.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
