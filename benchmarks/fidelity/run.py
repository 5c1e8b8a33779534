"""The fidelity study's command (``python -m benchmarks.fidelity``, from the repository root).

    python -m benchmarks.fidelity                      # 4 loads x 2 systems on the real cluster, then the simulations
    python -m benchmarks.fidelity --sim-only           # re-simulate against the real runs in fidelity.json
    python -m benchmarks.fidelity --loads heavy --systems llumnix   # one point, pooled with earlier runs

Writes ``OUT/fidelity.json`` (every request, step and probe: several MB, not committed),
``OUT/fidelity-summary.json`` (the reports, the noise floor and a line per real run:
committed) and ``OUT/fidelity.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fidelity.compare import (
    MEAN_GOAL,
    P99_GOAL,
    SIM_VARIANTS,
    build_report,
    noise_floor,
    pool_real,
)
from benchmarks.fidelity.factors import cluster_prefill, contention_scale, prefill_scale, step_gap
from benchmarks.fidelity.real import run_real
from benchmarks.fidelity.report import format_table, plot
from benchmarks.fidelity.simulate import run_sim
from benchmarks.fidelity.workload import FidelitySetup, make_trace

from llumnix.bench.machine import machine_info
from llumnix.core.errors import LlumnixError
from llumnix.sim.latency import get_latency_model

HERE = Path(__file__).resolve().parent
RAW = "fidelity.json"
SUMMARY = "fidelity-summary.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="the model both sides serve")
    p.add_argument("--profile", default=str(HERE / "profile-smollm2-cpu.json"),
                   help="latency profile the simulator runs with (llumnix profile writes it)")
    p.add_argument("--out", default="benchmarks/results", help="directory for fidelity.json, its summary and plot")
    p.add_argument("--loads", default=None, help="comma-separated load names to run (default: all)")
    p.add_argument("--systems", default=None, help="comma-separated systems to run (default: all)")
    p.add_argument("--sim-only", action="store_true",
                   help="re-simulate against the real runs already in fidelity.json")
    return p


@dataclass
class _Doc:
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)


def _chosen(flag: str, asked: str | None, known: list[str]) -> list[str]:
    names = asked.split(",") if asked else known
    unknown = [x for x in names if x not in known]
    if unknown:
        raise LlumnixError(f"{flag}: unknown {unknown[0]!r} (known: {', '.join(known)})")
    return names


def simulate_point(run: dict[str, Any], setup: FidelitySetup, system: str, trace: Any, profile: str,
                   model: Any) -> None:
    """Every simulation variant of one point (``SIM_VARIANTS``), against its real runs."""
    gaps = [g for r in run["real_runs"] if (g := step_gap(r.get("step_probe") or {})) is not None]
    gap = statistics.median(gaps) if gaps else 0.0
    run["sim"] = run_sim(setup, system, trace, profile, step_gap_s=gap)
    # Each real run against a simulation at its own machine speed: scaled by
    # the step probe taken right before it, or by its own prefill steps.
    probe = {i: f for i, r in enumerate(run["real_runs"])
             if r.get("step_probe") and (f := contention_scale(r["step_probe"], model))}
    prefill = {i: f for i, r in enumerate(run["real_runs"]) if (f := prefill_scale(r, trace, model))}
    # ... or with the decode neighbor factor the live cluster showed right before
    # it (a prediction: nothing from the trace itself).
    measured = {i: f for i, r in enumerate(run["real_runs"])
                if (f := (r.get("neighbor_probe") or {}).get("ratio"))}
    # ... and the prefill speed and neighbor factor it showed as well.
    both = {i: {"neighbor_decode": measured[i], "cluster_prefill": cp}
            for i, r in enumerate(run["real_runs"])
            if i in measured and (cp := cluster_prefill(r.get("prefill_probe") or {}, model))}
    for key, name, values in (
            ("sim_scaled", "scales", {i: {"scale": f} for i, f in probe.items()}),
            ("sim_in_run", "scales", {i: {"scale": f} for i, f in prefill.items()}),
            ("sim_neighbor", "neighbor_decode", {i: {"neighbor_decode": f} for i, f in measured.items()}),
            ("sim_cluster", "cluster_factors", both)):
        if values:
            sims = [run_sim(setup, system, trace, profile, step_gap_s=gap, **kw) for kw in values.values()]
            params = [next(iter(kw.values())) if len(kw) == 1 else kw for kw in values.values()]
            run[key] = {**pool_real(sims), name: params, "real_runs": list(values)}


def run_study(args: argparse.Namespace) -> int:
    setup = FidelitySetup(model=args.model)
    profile = args.profile
    loads = _chosen("--loads", args.loads, [ld.name for ld in setup.loads])
    systems = [s for s in setup.systems if s in _chosen("--systems", args.systems, list(setup.systems))]
    if not Path(profile).is_file():
        raise LlumnixError(f"profile {profile!r} not found: run `llumnix profile --out {profile}` first")
    out = Path(args.out)
    path = out / RAW
    if args.sim_only and not path.is_file():
        raise LlumnixError(f"--sim-only needs the real runs in {path}: run the study without it first")
    out.mkdir(parents=True, exist_ok=True)
    doc = _Doc(json.loads(path.read_text()).get("runs", {}) if path.exists() else {})
    model = get_latency_model(profile)
    try:
        for load in (ld for ld in setup.loads if ld.name in loads):
            trace = make_trace(setup, load)
            for system in systems:
                key = f"{load.name}/{system}"
                run = doc.runs.setdefault(key, {"real_runs": []})
                if not args.sim_only:
                    print(f"fidelity {key}: real cluster, {len(trace)} requests at {load.rate} req/s ...",
                          flush=True)
                    run["real_runs"].append(run_real(setup, system, trace))
                simulate_point(run, setup, system, trace, profile, model)
                write(out, doc, setup, profile)
    finally:
        if not args.sim_only:
            import ray

            if ray.is_initialized():
                ray.shutdown()
    reports = write(out, doc, setup, profile)
    plot(doc.runs, out / "fidelity.png", [ld.name for ld in setup.loads])
    for name, report in reports.items():
        if not report["table"]:
            continue  # no real run has what this variant needs (e.g. runs from before its probe)
        print(f"-- simulator with {name}")
        print(format_table(report))
        g = report["goals"]
        accuracy = "met" if g["accuracy_met"] else f"missed ({len(g['misses'])})"
        print(f"means within {100 * MEAN_GOAL:.0f}% and P99 within {100 * P99_GOAL:.0f}%: "
              f"{accuracy}; ranking by mean end-to-end: "
              f"{'same' if g['ranking_met'] else 'differs'}")
    print(f"wrote {path}, {out / SUMMARY} and {out / 'fidelity.png'}")
    return 0


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """One real run in a few numbers (the summary keeps these, not its requests and steps)."""
    return {"num_requests": len(run.get("e2e", [])), "num_errors": run.get("num_errors"),
            "num_migrations": run.get("num_migrations"), "num_preemptions": run.get("num_preemptions"),
            "duration_s": run.get("duration_s"),
            "serving_overhead_median_s": (run.get("serving_overhead") or {}).get("median_s"),
            "neighbor_probe_ratio": (run.get("neighbor_probe") or {}).get("ratio"),
            "prefill_probe_ratio": (run.get("prefill_probe") or {}).get("ratio"),
            "mean_step_gap_s": (run.get("steps") or {}).get("mean_gap_s"),
            "loadavg_after": run.get("loadavg_after")}


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """``fidelity.json`` without the samples: setup, reports, noise floor, and per point
    its real runs' summaries (``run_summary``) and which simulation variants it has."""
    runs = {key: {"real_runs": [run_summary(r) for r in run.get("real_runs", [])],
                  "sim_variants": sorted(k for k in run if k.startswith("sim"))}
            for key, run in data["runs"].items()}
    return {**{k: v for k, v in data.items() if k != "runs"}, "runs": runs,
            "regenerate": "python -m benchmarks.fidelity  (writes the full fidelity.json beside this file)"}


def write(out: Path, doc: _Doc, setup: FidelitySetup, profile: str) -> dict[str, Any]:
    reports = {name: build_report(doc.runs, setup, key) for name, key in SIM_VARIANTS.items()}
    data = {"setup": asdict(setup), "profile": profile, "reports": reports, "noise_floor": noise_floor(doc.runs),
            "runs": doc.runs, "machine": machine_info(with_torch=False)}
    for name, content in ((RAW, data), (SUMMARY, summarize(data))):
        tmp = out / f"{name}.tmp"
        tmp.write_text(json.dumps(content, indent=1) + "\n")
        tmp.replace(out / name)
    return reports


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_study(args)
    except (LlumnixError, OSError) as e:
        if os.environ.get("LLUMNIX_DEBUG"):
            raise
        print(f"fidelity: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
