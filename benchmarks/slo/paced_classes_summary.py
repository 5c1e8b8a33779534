"""The committed summary of `paced_classes.sh` (issue 47's real two-class cluster run): per
run the classes' attainment (client and gateway), the pace's overruns and the cluster's
events; over seeds the per-class summary, the paired differences from INFaaS++ and the
goal (``bench cluster``'s own ``slo_classes``); and the simulator's prediction of the
attainment differences (``sim_vs_real.json``) where it ran.

    python benchmarks/slo/paced_classes_summary.py OUT_DIR [--loadavg FILE] [--note TEXT] \
        --out benchmarks/slo/paced_classes_summary.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _r3(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def run_line(system: str, run: dict[str, Any]) -> dict[str, Any]:
    by = run.get("by_slo_class", {})
    return {"system": system, "load": run["load"], "seed": run["seed"], "rate_req_s": _r3(run["rate_req_s"]),
            "num_ok": run["num_ok"], "num_requests": run["num_requests"],
            "classes": {k: {"met": c["num_met"], "of": c["num_requests"], "attainment": _r3(c["attainment"]),
                            "gateway_met": c["gateway_met"], "gateway_of": c["gateway_requests"]}
                        for k, c in by.items()},
            "preemptions": run["num_preemptions"], "migrations_committed": run["migrations_committed"],
            "migrations_aborted": run["migrations_aborted"], "ttft_p99_s": _r3(run["ttft_s"]["p99"]),
            "itl_p99_s": _r3(run["itl_s"]["p99"]), "paced_steps": run.get("paced_steps"),
            "pace_overrun_steps": run.get("pace_overrun_steps")}


def summarize(out_dir: Path, loadavg: Path | None = None, note: str | None = None) -> dict[str, Any]:
    data = json.loads((out_dir / "cluster.json").read_text())
    s = data["settings"]
    keep = ("model", "instances", "num_blocks", "block_size", "max_num_seqs", "scale", "max_input", "max_output",
            "num_requests", "seeds", "loads", "systems", "pace", "trace_tokenizer", "interleave",
            "probe_requests", "probe_concurrency", "mean_prompt", "mean_output", "trace")
    runs = [run_line(sr["system"], r) for sr in data["systems"] for r in sr["runs"]]
    paced = sum(r["paced_steps"] or 0 for r in runs)
    over = sum(r["pace_overrun_steps"] or 0 for r in runs)
    out: dict[str, Any] = {
        "note": note, "settings": {k: s[k] for k in keep if k in s}, "capacity": data["capacity"] or data["systems"][0]["capacity"], "wall_s": round(data["wall_s"]),
        "loadavg_before": data["loadavg_before"], "loadavg_after": data["loadavg_after"],
        "machine": data["machine"], "partial": data.get("partial"), "slo_classes": data.get("slo_classes"),
        "pace_overran": {"steps": over, "of": paced, "share": _r3(over / paced) if paced else None,
                         "worst_run_share": max((_r3(r["pace_overrun_steps"] / r["paced_steps"]) or 0.0
                                                 for r in runs if r["paced_steps"]), default=None)},
        "runs": runs}
    sim = out_dir / "sim_vs_real.json"
    if sim.is_file():
        rows = json.loads(sim.read_text())["rows"]
        out["sim_vs_real"] = [r for r in rows if r["metric"].startswith("attainment:")] + \
            [r for r in rows if not r["metric"].startswith("attainment:")]
    if loadavg is not None and loadavg.is_file():
        out["loadavg_during"] = [line.split()[:4] for line in loadavg.read_text().splitlines() if line.strip()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="paced_classes.sh's OUT_DIR (cluster.json, sim_vs_real.json)")
    ap.add_argument("--loadavg", type=Path, help="/proc/loadavg sampled during the run, a line a sample: UTC time, then the file's fields")
    ap.add_argument("--note", help="what the record is (e.g. why it was cut short)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.write_text(json.dumps(summarize(a.out_dir, a.loadavg, a.note), indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
