"""The committed summary of PD cluster runs: per run and system, the figures ``run.py``
prints (median and range over seeds, PD's ratios to co-located seed by seed) and each
run's load average, from one or more ``pd_cluster.json`` files.

    python benchmarks/pd_cluster/summarize.py LABEL=PATH [LABEL=PATH ...] [--out summary.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from run import summary  # noqa: E402 - this folder's script, not a package


def compact(path: Path) -> dict[str, Any]:
    d = json.loads(path.read_text())
    per_seed = {system: [{"seed": r["seed"], "load_avg_1m": [round(x, 1) for x in r["load_avg_1m"]],
                          "ttft_p99_s": r["summary"]["ttft_s"]["p99"], "itl_p50_s": r["summary"]["itl_s"]["p50"],
                          "itl_p99_s": r["summary"]["itl_s"]["p99"], "tpot_mean_s": r["summary"]["tpot_s"]["mean"],
                          "e2e_mean_s": r["summary"]["e2e_s"]["mean"],
                          "handoffs_done": r["pd"].get("handoffs_done"),
                          "handoff_downtime_s": r["pd"].get("handoff_downtime_s")} for r in rs]
                for system, rs in d["runs"].items()}
    return {"rule": d["rule"], "capacity_req_s": d["capacity_req_s"], "rate_req_s": d["rate_req_s"],
            "workload": d["workload"], "cores": d["machine"].get("cores"), "wall_s": d["wall_s"],
            "summary": summary(d["runs"]), "per_seed": per_seed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    ap.add_argument("--out", default=str(Path(__file__).with_name("summary.json")))
    args = ap.parse_args()
    out = {label: compact(Path(path)) for label, path in (a.split("=", 1) for a in args.runs)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
