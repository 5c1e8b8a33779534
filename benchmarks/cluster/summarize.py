"""The small summary of `llumnix bench cluster` runs that is committed here: the aggregate
over seeds, the goals, one line per run, and (``--before``) a run of the same systems on
the code before a change, side by side.

    .venv/bin/python -m benchmarks.cluster.summarize ~/.cache/llumnix/bench/cluster \
        [--before DIR] [--note TEXT] --out benchmarks/cluster/summary.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from llumnix.bench.cluster_report import goals, refusals


def _run_line(system: str, run: dict[str, Any]) -> dict[str, Any]:
    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {"system": system, "load": run["load"], "seed": run["seed"], "rate_req_s": r3(run["rate_req_s"]),
            "num_ok": run["num_ok"], "num_requests": run["num_requests"],
            "preemptions": run["num_preemptions"], "migrations_committed": run["migrations_committed"],
            "migrations_aborted": run["migrations_aborted"], "abort_reasons": run["abort_reasons"],
            "downtime_p99_s": r3(run["downtime_s"]["p99"]), "ttft_mean_s": r3(run["ttft_s"]["mean"]),
            "ttft_p99_s": r3(run["ttft_s"]["p99"]), "itl_p50_s": r3(run["itl_s"]["p50"]),
            "itl_p99_s": r3(run["itl_s"]["p99"]), "itl_max_s": r3(run["itl_s"]["max"]),
            "tpot_mean_s": r3(run["tpot_s"]["mean"]), "e2e_mean_s": r3(run["e2e_s"]["mean"]),
            "goodput_req_s": r3(run["goodput_req_s"]), "kv_usage_mean": r3(run["kv_usage"]["mean"]),
            "kv_usage_max": r3(run["kv_usage"]["max"])}


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    s = data["settings"]
    return {"settings": s, "capacity": data["capacity"], "wall_s": round(data["wall_s"]),
            "loadavg_before": data["loadavg_before"], "loadavg_after": data["loadavg_after"],
            "machine": data["machine"], "aggregate": data["aggregate"],
            "goals": goals(data["aggregate"], tuple(s["loads"])),
            "runs": [_run_line(sr["system"], r) for sr in data["systems"] for r in sr["runs"]],
            "startup_s": {sr["system"]: round(sr["startup_s"], 1) for sr in data["systems"]}}


def _fmt(a: dict[str, Any] | None, scale: float = 1.0) -> str:
    if not a:
        return "-"
    return f"{scale * a['median']:.2f} ({scale * a['min']:.2f}-{scale * a['max']:.2f})"


def markdown(summary: dict[str, Any]) -> str:
    """One row per system and load: medians over seeds (min-max), counts summed."""
    rows = ["| system | load | TTFT mean s | TTFT P99 s | ITL P99 s | ITL max s | TPOT mean s | e2e mean s | "
            "goodput req/s | KV mean | preempt | migr ok/aborted (refused) |", "|" + "---|" * 12]
    for system, loads in summary["aggregate"].items():
        for load, a in loads.items():
            refused = refusals(a["abort_reasons"])
            rows.append(f"| {system} | {load} | {_fmt(a['ttft_mean'])} | {_fmt(a['ttft_p99'])} | "
                        f"{_fmt(a['itl_p99'])} | {_fmt(a['itl_max'])} | {_fmt(a['tpot_mean'])} | "
                        f"{_fmt(a['e2e_mean'])} | {_fmt(a['goodput_req_s'])} | {_fmt(a['kv_usage_mean'])} | "
                        f"{a['num_preemptions']} | {a['migrations_committed']}/{a['migrations_aborted']} ({refused}) |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="the --out folder of a bench cluster run (holds cluster.json)")
    p.add_argument("--before", default=None, help="a run of the same settings on the code before the change")
    p.add_argument("--note", default="", help="what was run, when, and how loaded the machine was")
    p.add_argument("--out", required=True)
    p.add_argument("--markdown", action="store_true", help="also print the tables")
    a = p.parse_args()
    out: dict[str, Any] = {"note": a.note, "after": summarize(json.loads((Path(a.run) / "cluster.json").read_text()))}
    if a.before:
        out["before"] = summarize(json.loads((Path(a.before) / "cluster.json").read_text()))
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    if a.markdown:
        for part in ("after", "before"):
            if part in out:
                print(f"\n{part}:\n" + markdown(out[part]))
        print(json.dumps(out["after"]["goals"], indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
