"""Issue 47's simulator goal study: goodput per system over a rate sweep and seeds, from
the records of ``benchmarks/slo/goal.yaml`` (run here, or read from a finished run).

Goodput of one (system, seed) is the highest swept rate at which it, and every lower swept
rate, has >= 90% of each SLO class meeting both objectives (``sim/metrics.goodput`` over
the worst class's attainment); ``interpolated`` is the crossing between that rate and the
next. Reported: the mean over seeds per system, the ratios of ``slo`` to ``llumnix`` and
``infaas++`` (mean of the per-seed ratios: each seed replays the same trace), the
interactive attainment of each system at the batch class's goodput rate, and rescue by
migration's and the engines' deadline order's shares of the gain over llumnix: rescue's
(slo-rescue - slo) / (slo-rescue - llumnix) (rescue is opt-in: ``slo`` runs without it;
records of before, where ``slo`` had it and ``slo-no-rescue`` did not, read the same way),
the deadline order's (slo - slo-fcfs) / (slo - llumnix).

    PYTHONPATH=src .venv/bin/python benchmarks/slo/study.py --out /tmp/slo_goal [--jobs 2] [--set k=v ...]
    PYTHONPATH=src .venv/bin/python benchmarks/slo/study.py --records /tmp/slo_goal/metrics.json [more.json ...]

Writes ``summary.json`` beside the records, and with ``--summary PATH`` a copy there (the
committed ``benchmarks/slo/goal_summary.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from llumnix.sim.metrics import goodput

HERE = Path(__file__).resolve().parent
SYSTEMS = ("infaas++", "llumnix", "slo", "slo-rescue", "slo-no-rescue", "slo-fcfs", "slo-overdue")


def worst_class(record: dict[str, Any]) -> float:
    return min(c["attainment"] for c in record["by_slo_class"].values())


def per_seed(records: list[dict[str, Any]], metric: Any = worst_class) -> dict[tuple[str, int], dict[str, float]]:
    points: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        points[(r["system"], r["seed"])].append((r["rate"], metric(r)))
    return {k: goodput(v) for k, v in points.items()}


def _mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    gp = per_seed(records)
    batch_gp = per_seed(records, lambda r: r["by_slo_class"]["batch"]["attainment"])
    systems = sorted({s for s, _ in gp}, key=lambda s: SYSTEMS.index(s) if s in SYSTEMS else 99)
    seeds = sorted({seed for _, seed in gp})
    out: dict[str, Any] = {"seeds": seeds, "rates": sorted({r["rate"] for r in records}), "systems": {}}
    for s in systems:
        rows = [gp[(s, k)] for k in seeds if (s, k) in gp]
        att_at_batch_gp = []
        for k in seeds:
            rate = batch_gp.get((s, k), {}).get("highest")
            rec = next((r for r in records if (r["system"], r["seed"], r["rate"]) == (s, k, rate)), None)
            if rec is not None:
                att_at_batch_gp.append(rec["by_slo_class"]["interactive"]["attainment"])
        by_rate: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in records:
            if r["system"] == s:
                for name, c in r["by_slo_class"].items():
                    by_rate[r["rate"]][name].append(c["attainment"])
        out["systems"][s] = {
            "goodput_highest": {str(k): gp[(s, k)]["highest"] for k in seeds if (s, k) in gp},
            "goodput_mean": _mean([g["highest"] for g in rows]),
            "goodput_interpolated_mean": _mean([g["interpolated"] for g in rows]),
            "interactive_at_batch_goodput_mean": _mean(att_at_batch_gp),
            "attainment_by_rate": {str(rate): {n: round(_mean(v), 4) for n, v in cls.items()}
                                   for rate, cls in sorted(by_rate.items())},
        }
    out["ratios"] = {}
    for base in ("llumnix", "infaas++"):
        for key in ("highest", "interpolated"):
            ratios = [gp[("slo", k)][key] / gp[(base, k)][key] for k in seeds
                      if ("slo", k) in gp and (base, k) in gp and gp[(base, k)][key] > 0]
            out["ratios"][f"slo/{base} ({key})"] = _mean(ratios)
    for part, full, ablated in (("rescue", "slo-rescue", "slo"), ("rescue", "slo", "slo-no-rescue"),
                                ("engine_order", "slo", "slo-fcfs")):
        if all(s in out["systems"] for s in (full, ablated, "llumnix")):
            for key in ("highest", "interpolated"):
                g = {s: _mean([gp[(s, k)][key] for k in seeds if (s, k) in gp]) for s in (full, ablated, "llumnix")}
                gain = g[full] - g["llumnix"]
                share = (g[full] - g[ablated]) / gain if gain > 0 else None
                out[f"{part}_share_of_gain" + ("" if key == "interpolated" else f" ({key})")] = share
    return out


def read_records(paths: list[str]) -> dict[str, Any]:
    """Several runs' metrics.json as one (the records of each; the first one's machine)."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    seen: set[tuple[Any, ...]] = set()
    records = []
    for d in docs:
        for r in d["records"]:
            key = (r["system"], r["trace"], r["rate"], r["seed"])
            if key not in seen:
                seen.add(key)
                records.append(r)
    return {"machine": docs[0].get("machine"), "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="run goal.yaml into this directory (outside the checkout)")
    ap.add_argument("--records", nargs="+", help="summarize finished runs' metrics.json instead (merged)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--summary", help="also write the summary here")
    args = ap.parse_args()
    if args.records:
        doc = read_records(args.records)
        out_dir = Path(args.records[0]).parent
    else:
        if not args.out:
            ap.error("give --out DIR (to run) or --records FILE (to summarize)")
        from llumnix.sim.config import load_config
        from llumnix.sim.runner import run_experiment

        cfg = load_config(HERE / "goal.yaml", [*args.overrides, f"jobs={args.jobs}"])
        run_experiment(cfg, args.out, show_progress=False, resume=True)
        out_dir = Path(args.out)
        doc = json.loads((out_dir / "metrics.json").read_text())
    summary = {"config": "benchmarks/slo/goal.yaml", "overrides": args.overrides, "machine": doc.get("machine"),
               "loadavg": Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else None,
               "num_requests": doc["records"][0]["num_requests"] if doc["records"] else None,
               **summarize(doc["records"])}
    text = json.dumps(summary, indent=1) + "\n"
    (out_dir / "summary.json").write_text(text)
    if args.summary:
        Path(args.summary).write_text(text)
    print(json.dumps({k: v for k, v in summary.items() if k == "ratios" or "share_of_gain" in k}, indent=1))
    for s, v in summary["systems"].items():
        print(f"{s:14} goodput {v['goodput_mean']:.2f} (interp {v['goodput_interpolated_mean']:.2f}) "
              f"interactive@batch-goodput {v['interactive_at_batch_goodput_mean']:.3f}")


if __name__ == "__main__":
    main()
