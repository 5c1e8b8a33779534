"""Paired comparison of two systems over seeds: for each (trace, rate) and metric, the
geometric mean over seeds of the per-seed ratio B / A, a 95% interval for it (t over the
log-ratios), and the seeds on which B is lower. A seed fixes the trace, which both
systems replay identically, so the ratio pairs like with like.

    .venv/bin/python benchmarks/sim/paired_seeds.py results/improvement-10seeds/metrics.json llumnix llumnix-shield
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

# two-sided 95% t quantiles by degrees of freedom (scipy is not a dependency)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 19: 2.09, 29: 2.05}


def t95(dof: int) -> float:
    return _T95.get(dof) or _T95[max(k for k in _T95 if k <= dof)]


def paired_rows(records: list[dict], a: str, b: str, metrics: tuple[str, ...] = ("prefill", "decode"),
                ) -> list[dict]:
    rows = []
    points = sorted({(r["trace"], r["rate"]) for r in records}, key=lambda p: (p[0], p[1]))
    for trace, rate in points:
        row: dict = {"trace": trace, "rate": rate}
        for m in metrics:
            xa = {r["seed"]: r[m]["p99"] for r in records if (r["trace"], r["rate"], r["system"]) == (trace, rate, a)}
            xb = {r["seed"]: r[m]["p99"] for r in records if (r["trace"], r["rate"], r["system"]) == (trace, rate, b)}
            seeds = sorted(set(xa) & set(xb))
            if len(seeds) < 2:
                continue
            logs = [math.log(xb[s] / xa[s]) for s in seeds]
            mean, half = statistics.mean(logs), t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            row[m] = {"ratio": math.exp(mean), "lo": math.exp(mean - half), "hi": math.exp(mean + half),
                      "lower": sum(x < 0 for x in logs), "seeds": len(seeds)}
        rows.append(row)
    return rows


def markdown(rows: list[dict], a: str, b: str) -> str:
    out = [f"| trace | rate | P99 prefill {b} / {a} (95% interval; seeds lower) | "
           f"P99 decode {b} / {a} (95% interval; seeds lower) |", "|---|---|---|---|"]
    for r in rows:
        cells = []
        for m in ("prefill", "decode"):
            c = r.get(m)
            if c is None:
                cells.append("-")
                continue
            mark = " **better**" if c["hi"] < 1 else (" **worse**" if c["lo"] > 1 else "")
            cells.append(f"{c['ratio']:.3f} ({c['lo']:.2f}-{c['hi']:.2f}; {c['lower']}/{c['seeds']}){mark}")
        out.append(f"| {r['trace']} | {r['rate']:g} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", help="a metrics.json of llumnix simulate")
    ap.add_argument("a", help="the baseline system")
    ap.add_argument("b", help="the system compared with it")
    args = ap.parse_args()
    with open(args.metrics) as f:
        records = json.load(f)["records"]
    print(markdown(paired_rows(records, args.a, args.b), args.a, args.b))


if __name__ == "__main__":
    main()
