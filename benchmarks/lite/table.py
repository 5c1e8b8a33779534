"""The tables of a lite-mode benchmark record: per workload and rate, each router's
median over seeds (and the spread, min-max) of TTFT mean/P99 and e2e mean/P99; the added
latency; the failures with one engine killed; and the issue's goals, met or missed.

    python -m benchmarks.lite.table ~/lite-bench/result.json
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

LITE = "llumnix-lite/llumnix"
METRICS = ("ttft_mean_s", "ttft_p99_s", "e2e_mean_s", "e2e_p99_s")


def medians(record: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, tuple[float, float, float]]]:
    """(workload, rate, router) -> metric -> (median, min, max) over seeds."""
    by: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in record["runs"]:
        for m in METRICS:
            if r[m] is not None:
                by[(r["workload"], r["rate"], r["router"])][m].append(r[m])
        by[(r["workload"], r["rate"], r["router"])]["failed"].append(r["failed"])
    return {k: {m: (statistics.median(v), min(v), max(v)) for m, v in ms.items()} for k, ms in by.items()}


def main(path: str) -> None:
    with open(path) as f:
        record = json.load(f)
    med = medians(record)
    print(f"engines: {record['engines']}; capacity (req/s): {record.get('capacity_rps')}")
    print(f"{'workload':9} {'rate':5} {'router':28} " + " ".join(f"{m:>22}" for m in METRICS) + "  failed")
    for (w, rate, router), ms in sorted(med.items()):
        cells = " ".join(f"{ms[m][0]:7.2f} [{ms[m][1]:5.2f},{ms[m][2]:5.2f}]" if m in ms else f"{'-':>22}"
                         for m in METRICS)
        print(f"{w:9} {rate:5} {router:28} {cells}  {ms['failed'][0]:.0f}")
    print("\nadded latency (ms, in front of servers that do no work):")
    for router, v in record.get("added_latency_ms", {}).items():  # medians over rounds [min, max]
        print(f"  {router:28} P50 {v['p50_ms_median']:6.2f} [{v['p50_ms_min']:.2f}, {v['p50_ms_max']:.2f}]"
              f"  P99 {v['p99_ms_median']:6.2f} [{v['p99_ms_min']:.2f}, {v['p99_ms_max']:.2f}]")
    print("\none of three engines killed mid-run:")
    for router, v in record.get("kill_one_of_three", {}).items():
        print(f"  {router:28} failed {v['failed']}/{v['n']}  {v['errors']}")
    kill_table(record.get("kill_runs", []))
    print("\ngoals:")
    for (w, rate) in sorted({(w, r) for w, r, _ in med}):
        sg = {k[2]: v for k, v in med.items() if k[:2] == (w, rate) and k[2].startswith("sglang")}
        lite = med.get((w, rate, LITE))
        if not sg or lite is None:
            continue
        for m in ("ttft_p99_s", "e2e_mean_s"):
            best = min(sg, key=lambda r: sg[r][m][0])
            ok = lite[m][0] <= sg[best][m][0]
            print(f"  {w} {rate} {m}: lite {lite[m][0]:.2f} vs best sglang ({best}) {sg[best][m][0]:.2f}: "
                  f"{'met' if ok else 'missed'}")
    lat = record.get("added_latency_ms", {})
    if LITE in lat:
        best = min((v["p50_ms_median"], k) for k, v in lat.items() if k.startswith("sglang"))
        mine = lat[LITE]["p50_ms_median"]
        print(f"  added latency P50 within 1 ms of sglang-router's ({best[1]} {best[0]:.2f} ms): lite "
              f"{mine:.2f} ms: {'met' if mine <= best[0] + 1 else 'missed'}")
    for (w, rate) in sorted({(w, r) for w, r, _ in med}):
        for variant in sorted({k[2] for k in med if k[:2] == (w, rate) and k[2].startswith(LITE + "@")}):
            sg = {k[2]: v for k, v in med.items() if k[:2] == (w, rate) and k[2].startswith("sglang")}
            for m in ("ttft_p99_s", "e2e_mean_s"):
                best = min(sg, key=lambda r: sg[r][m][0])
                mine = med[(w, rate, variant)][m][0]
                print(f"  {w} {rate} {m}: {variant} {mine:.2f} vs best sglang ({best}) {sg[best][m][0]:.2f}: "
                      f"{'met' if mine <= sg[best][m][0] else 'missed'}")
    kill = record.get("kill_one_of_three", {})
    if LITE in kill:
        print(f"  zero failed requests with one engine killed: lite {kill[LITE]['failed']}: "
              f"{'met' if kill[LITE]['failed'] == 0 else 'missed'}")


def kill_table(runs: list[dict[str, Any]]) -> None:
    """Per router over seeds: failed requests, and the requests in flight at the kill (how
    many failed, their TTFT mean beside the other requests', medians [min, max])."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by[r["router"]].append(r)

    def spread(xs: list[float | None]) -> str:
        v = [x for x in xs if x is not None]
        return f"{statistics.median(v):6.2f} [{min(v):.2f}, {max(v):.2f}]" if v else "     -"

    for router, rs in by.items():
        print(f"  {router:36} failed {sum(r['failed'] for r in rs)}/{sum(r['n'] for r in rs)}"
              f"  in flight at the kill {sum(r['in_flight_at_kill'] for r in rs)}"
              f" (failed {sum(r['in_flight_failed'] for r in rs)}), their TTFT mean"
              f" {spread([r['in_flight_ttft_mean_s'] for r in rs])} s, max {spread([r['in_flight_ttft_max_s'] for r in rs])}"
              f" s; the others' {spread([r['others_ttft_mean_s'] for r in rs])} s;"
              f" load {min(r['load_avg_1m'][0] for r in rs):.1f}-{max(r['load_avg_1m'][1] for r in rs):.1f}"
              f"  {sorted({e for r in rs for e in r['errors']})[:2]}")


if __name__ == "__main__":
    main(sys.argv[1])
