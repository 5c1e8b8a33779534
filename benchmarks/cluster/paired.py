"""llumnix against INFaaS++ seed by seed, over one or more `llumnix bench cluster` results
(runs of the same settings split over several invocations, e.g. a GPU lease's two calls):
per load, preemptions summed and per seed, the share of requests INFaaS++ preempted, and the
median over seeds of each latency's llumnix / INFaaS++ ratio taken seed by seed.

    .venv/bin/python -m benchmarks.cluster.paired A/cluster.json B/cluster.json [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

METRICS = (("ttft_s", "mean"), ("ttft_s", "p99"), ("itl_s", "p50"), ("itl_s", "p99"), ("itl_s", "max"),
           ("tpot_s", "mean"), ("tpot_s", "p99"), ("e2e_s", "mean"), ("e2e_s", "p99"))


def runs_by(files: list[Path]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """(system, load) -> seed -> run; a later file's run of the same seed replaces an earlier one."""
    out: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for f in files:
        for s in json.loads(f.read_text())["systems"]:
            for r in s["runs"]:
                out.setdefault((s["system"], str(r["load"])), {})[r["seed"]] = r
    return out


def paired(runs: dict[tuple[str, str], dict[int, dict[str, Any]]], base: str = "infaas++",
           other: str = "llumnix") -> dict[str, Any]:
    out: dict[str, Any] = {}
    loads = sorted({load for (_, load) in runs}, key=lambda x: (x == "burst", x))
    for load in loads:
        b, o = runs.get((base, load), {}), runs.get((other, load), {})
        seeds = sorted(set(b) & set(o))
        if not seeds:
            continue
        pb = [b[s]["num_preemptions"] for s in seeds]
        po = [o[s]["num_preemptions"] for s in seeds]
        reasons: Counter[str] = Counter()
        for s in seeds:
            reasons.update({k: int(v) for k, v in o[s]["abort_reasons"].items() if v})
        started = sum(o[s]["migrations_committed"] + o[s]["migrations_aborted"] for s in seeds)
        row: dict[str, Any] = {
            "seeds": seeds, "requests_per_run": b[seeds[0]]["num_requests"],
            f"{base}_preemptions": pb, f"{other}_preemptions": po,
            f"{base}_preempted_per_request": round(sum(pb) / sum(b[s]["num_requests"] for s in seeds), 3),
            "preemption_ratio": round(sum(po) / sum(pb), 2) if sum(pb) else None,
            "seeds_fewer_equal_more": [sum(x < y for x, y in zip(po, pb, strict=True)),
                                       sum(x == y for x, y in zip(po, pb, strict=True)),
                                       sum(x > y for x, y in zip(po, pb, strict=True))],
            "migrations_started": started, "migrations_committed": sum(o[s]["migrations_committed"] for s in seeds),
            "abort_reasons": dict(reasons),
            "downtime_p50_ms_per_seed": [round(1000 * o[s]["downtime_s"]["p50"], 1) if o[s]["downtime_s"] else None
                                         for s in seeds]}
        for key, sub in METRICS:
            vb = [b[s][key][sub] for s in seeds]
            vo = [o[s][key][sub] for s in seeds]
            row[f"{key[:-2]}_{sub}"] = {base: round(statistics.median(vb), 3), other: round(statistics.median(vo), 3),
                                        "ratio_median": round(statistics.median(y / x for x, y in zip(vb, vo,
                                                                                                     strict=True)), 2)}
        out[load] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    res = paired(runs_by(a.files))
    for load, r in res.items():
        print(f"load {load}: seeds {r['seeds']}, preemptions infaas++ {sum(r['infaas++_preemptions'])} "
              f"({r['infaas++_preempted_per_request']:.1%} of requests) llumnix {sum(r['llumnix_preemptions'])}: "
              f"{r['preemption_ratio']}x; seeds fewer/equal/more {r['seeds_fewer_equal_more']}; migrations "
              f"{r['migrations_committed']} of {r['migrations_started']} committed, aborts {r['abort_reasons']}")
        print("   " + ", ".join(f"{k} {r[k]['ratio_median']}x" for k in r if isinstance(r[k], dict)
                                and "ratio_median" in r[k]))
    if a.out:
        a.out.write_text(json.dumps({"inputs": [str(f) for f in a.files], "paired": res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
