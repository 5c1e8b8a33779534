"""Simulated against real: per metric sim, real and the relative error; the goals; the
real system's noise floor (its repeats against each other)."""
from __future__ import annotations

import statistics
from typing import Any

import numpy as np
from benchmarks.fidelity.workload import FidelitySetup

MEAN_GOAL = 0.10
"""Largest relative error of a mean (TTFT, decode per token, end-to-end)."""
P99_GOAL = 0.25
"""Largest relative error of a P99."""
MEAN_METRICS = ("ttft_mean", "decode_mean", "e2e_mean")
P99_METRICS = ("ttft_p99", "decode_p99")
METRICS = ("ttft_mean", "ttft_p99", "decode_mean", "decode_p99", "e2e_mean", "e2e_p99",
           "num_migrations", "num_preemptions")
RANK_METRICS = ("ttft_mean", "ttft_p99", "decode_mean", "e2e_mean")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def metrics_of(samples: dict[str, Any], offset_s: float = 0.0) -> dict[str, float]:
    """The compared metrics of one side; ``offset_s`` is added to TTFT and end-to-end."""
    ttft = [t + offset_s for t in samples["ttft"]]
    e2e = [t + offset_s for t in samples["e2e"]]
    dec = list(samples["decode"])
    return {"ttft_mean": float(np.mean(ttft)) if ttft else float("nan"), "ttft_p99": percentile(ttft, 99),
            "decode_mean": float(np.mean(dec)) if dec else float("nan"), "decode_p99": percentile(dec, 99),
            "e2e_mean": float(np.mean(e2e)) if e2e else float("nan"), "e2e_p99": percentile(e2e, 99),
            "num_migrations": float(samples["num_migrations"]),
            "num_preemptions": float(samples["num_preemptions"])}


def rel_error(sim: float, real: float) -> float | None:
    if real == 0:
        return 0.0 if sim == 0 else None
    return (sim - real) / real


def compare(sim: dict[str, float], real: dict[str, float]) -> dict[str, dict[str, float | None]]:
    return {m: {"sim": sim[m], "real": real[m], "rel_error": rel_error(sim[m], real[m])} for m in METRICS}


def pool_real(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several real runs of one point as one sample: latencies pooled, counts averaged."""
    return {"ttft": [x for r in runs for x in r["ttft"]], "decode": [x for r in runs for x in r["decode"]],
            "e2e": [x for r in runs for x in r["e2e"]],
            "num_migrations": statistics.fmean(r["num_migrations"] for r in runs),
            "num_preemptions": statistics.fmean(r["num_preemptions"] for r in runs)}


def evaluate(table: dict[str, dict[str, dict[str, dict[str, float | None]]]],
             loads: list[str], systems: list[str]) -> dict[str, Any]:
    """Goals over a table {load: {system: compare(...)}}: every mean within MEAN_GOAL,
    every P99 within P99_GOAL, and per load and metric the same order of systems."""
    misses = []
    for load in loads:
        for system in systems:
            row = table.get(load, {}).get(system)
            if row is None:
                continue
            for m in (*MEAN_METRICS, *P99_METRICS):
                err = row[m]["rel_error"]
                goal = MEAN_GOAL if m in MEAN_METRICS else P99_GOAL
                if err is None or abs(err) > goal:
                    misses.append({"load": load, "system": system, "metric": m, "rel_error": err, "goal": goal})
    ranking = {}
    for load in loads:
        rows = table.get(load, {})
        if not all(s in rows for s in systems) or len(systems) < 2:
            continue
        for m in RANK_METRICS:
            real = sorted(systems, key=lambda s: float(rows[s][m]["real"] or 0.0))
            sim = sorted(systems, key=lambda s: float(rows[s][m]["sim"] or 0.0))
            ranking[f"{load}/{m}"] = {"real": real, "sim": sim, "same": real == sim}
    return {"mean_goal": MEAN_GOAL, "p99_goal": P99_GOAL, "misses": misses,
            "accuracy_met": not misses, "ranking": ranking,
            "ranking_met": all(r["same"] for k, r in ranking.items() if k.endswith("/e2e_mean"))}


def build_report(runs: dict[str, dict[str, Any]], setup: FidelitySetup, sim_key: str = "sim") -> dict[str, Any]:
    """``runs``: {"load/system": {"real_runs": [...], sim_key: {...}}} -> the comparison."""
    table: dict[str, dict[str, Any]] = {}
    for key, run in runs.items():
        load, system = key.split("/", 1)
        if not run.get("real_runs") or not run.get(sim_key):
            continue
        # A simulation at one real run's speed is compared with that run only.
        real = [run["real_runs"][i] for i in run[sim_key].get("real_runs", range(len(run["real_runs"])))]
        offset = statistics.median(r["serving_overhead"]["median_s"] for r in real)
        table.setdefault(load, {})[system] = compare(metrics_of(run[sim_key], offset), metrics_of(pool_real(real)))
    loads = [ld.name for ld in setup.loads if ld.name in table]
    return {"table": table, "goals": evaluate(table, loads, list(setup.systems))}



SIM_VARIANTS = {"profile": "sim", "profile, neighbor factor from the cluster probe": "sim_neighbor",
                "profile, prefill and neighbor factors from the cluster probes": "sim_cluster",
                "profile x step probe": "sim_scaled", "profile x in-run prefill speed": "sim_in_run"}
"""Report name -> the run's simulation: the profile as measured; the profile with the
decode neighbor factor the live cluster showed in a probe right before the run; with that
and the cluster's prefill speed and prefill neighbor factor from a second probe (both
measured on the idle cluster before the trace); scaled by the
contention the live cluster's step probe showed right before the trace (both
predictions); scaled by the run's own prefill step durations (``prefill_scale``: the
machine's speed during the run, taken from prefill steps only, leaving decode,
queueing, batching and migration to be predicted)."""


def noise_floor(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The real system against itself: each later run of a point against its first run
    (same trace, same settings), as (later - first) / first per metric."""
    out: dict[str, dict[str, Any]] = {}
    for key, run in runs.items():
        real = run.get("real_runs") or []
        if len(real) < 2:
            continue
        load, system = key.split("/", 1)
        first = metrics_of(real[0])
        out.setdefault(load, {})[system] = [
            {m: rel_error(later[m], first[m]) for m in METRICS} for later in map(metrics_of, real[1:])]
    return out

