"""Goodput of every system on every trace from a PD sweep's metrics.json, the goals of
issue 33 checked, written as a small summary JSON.

    python benchmarks/sim/pd/summarize.py /tmp/pd/metrics.json [MORE.json ...] [--out summary.json]

Several metrics files (a sweep and its top-up at more rates) are read as one.

Goodput (DistServe's): per seed, the highest rate of the sweep at which it and every
lower rate have >= 90% of requests meeting both the TTFT and the TPOT objective
(``highest``), and the linear crossing toward the next rate (``interpolated``); median
and range over seeds. Ratios are of the medians of the interpolated goodput.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from llumnix.sim.metrics import goodput

COLOCATED, ADAPTIVE = "co-located", "pd-adaptive"


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    points: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    top: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    rates: dict[str, float] = {}
    slo = None
    for r in doc["records"]:
        slo = r.get("slo", slo)
        points[(r["trace"], r["system"], r["seed"])].append((r["rate"], r["slo"]["attainment"]))
        rates[r["trace"]] = max(rates.get(r["trace"], 0.0), r["rate"])
    for r in doc["records"]:
        if r["rate"] == rates[r["trace"]]:
            top[(r["trace"], r["system"])].append(r)
    traces: dict[str, Any] = {}
    for (trace, system, _seed), pts in sorted(points.items()):
        g = goodput(pts, (slo or {}).get("target", 0.9))
        entry = traces.setdefault(trace, {}).setdefault(system, {"highest": [], "interpolated": []})
        entry["highest"].append(g["highest"])
        entry["interpolated"].append(g["interpolated"])
    if slo is not None:
        slo = {k: v for k, v in slo.items() if k != "attainment"}  # the last record's measured share
    out: dict[str, Any] = {"slo": slo, "latency_model": doc.get("latency_model"), "traces": {}, "goals": {}}
    for trace, systems in traces.items():
        rows = {}
        for system, e in systems.items():
            recs = top[(trace, system)]
            rows[system] = {"goodput": _spread(e["interpolated"]), "goodput_highest": _spread(e["highest"]),
                            "at_top_rate": _top(recs)}
        out["traces"][trace] = rows
        out["goals"][trace] = _goals(trace, rows)
    return out


def _top(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over seeds at the sweep's top rate."""
    def med(f: Any) -> float:
        return float(statistics.median(f(r) for r in recs))

    row = {"rate": recs[0]["rate"], "slo_attainment": med(lambda r: r["slo"]["attainment"]),
           "ttft_p99": med(lambda r: r["ttft"]["p99"]), "tpot_p99": med(lambda r: r["tpot"]["p99"]),
           "itl_p50": med(lambda r: r["itl"]["p50"]), "itl_p99": med(lambda r: r["itl"]["p99"]),
           "e2e_p99": med(lambda r: r["e2e"]["p99"])}
    if "pd" in recs[0]:
        for k in ("handoffs", "handoffs_deferred", "handoffs_aborted", "lends", "reclaims", "flips"):
            row[k] = med(lambda r, k=k: r["pd"][k])
        row["handoff_downtime_p99"] = med(lambda r: r["pd"]["handoff_downtime"]["p99"])
    return row


def _goals(trace: str, rows: dict[str, Any]) -> dict[str, Any]:
    g = {s: r["goodput"]["median"] for s, r in rows.items()}
    static = {s: v for s, v in g.items() if s.startswith("pd-") and s != ADAPTIVE}
    if ADAPTIVE not in g or COLOCATED not in g or not static:
        return {}
    best = max(static, key=lambda s: static[s])
    adaptive, colocated = g[ADAPTIVE], g[COLOCATED]
    ratio = adaptive / colocated if colocated else float("inf")
    goals = {"best_static": best, "adaptive_over_best_static": adaptive / static[best] if static[best] else None,
             "adaptive_over_colocated": ratio,
             "adaptive_ge_best_static": adaptive >= static[best],
             "adaptive_loses_at_most_5pct_to_colocated": ratio >= 0.95}
    if trace.startswith("LongPrompt"):
        goals["adaptive_ge_1.3x_colocated"] = ratio >= 1.3
    return goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", help="summary JSON path (default: summary.json beside the metrics)")
    args = ap.parse_args()
    docs = [json.loads(Path(p).read_text()) for p in args.metrics]
    doc = {**docs[0], "records": [r for d in docs for r in d["records"]]}
    summary = summarize(doc)
    summary["machine"] = doc.get("machine")
    summary["num_records"] = len(doc["records"])
    summary["sources"] = [{"name": d.get("name"), "num_records": len(d["records"])} for d in docs]
    out = Path(args.out) if args.out else Path(args.metrics[0]).with_name("summary.json")
    out.write_text(json.dumps(summary, indent=1) + "\n")
    for trace, rows in summary["traces"].items():
        print(f"{trace}: goodput (req/s, median [min, max] of seeds)")
        for system, r in rows.items():
            g = r["goodput"]
            print(f"  {system:12s} {g['median']:6.2f} [{g['min']:.2f}, {g['max']:.2f}]   "
                  f"top rate: SLO {r['at_top_rate']['slo_attainment']:.2f}, ITL p99 {r['at_top_rate']['itl_p99']:.3f} s")
        print(f"  goals: {summary['goals'][trace]}")
    print(f"summary in {out}")


if __name__ == "__main__":
    main()
