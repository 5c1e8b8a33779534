"""The bench cluster's sizing in the simulator, over many seeds (issue 32): is "llumnix
preempts no more than INFaaS++" decidable with 3 seeds of 16 requests, and what does a
policy option change? ``python -m benchmarks.cluster.sim_small [--seeds 200] [--out F.json]``.

The trace is ``bench cluster``'s (real ShareGPT first turns x 0.125, prompts <= 32 and
outputs <= 64 tokens, Poisson; ``cluster_bench.make_requests``' streams), the cluster its
sizing (``--instances`` 2 of ``--blocks`` blocks of ``--block-size`` tokens, chunked prefill,
watermark 0.01), the engine and the policies the product's own (the simulator runs them);
step times are the simulator's a10-llama7b-serving model, not SmolLM2 on this CPU, so the
rates are the simulator's (``--rates``), chosen where INFaaS++'s preemptions per request
span the bench's (0.2-0.6). Per rate and system: preemptions summed over seeds, mean per
run, and, against INFaaS++ on the same seed, the paired difference's mean (with a 95%
bootstrap interval) and how often a block of 3 seeds would meet "at most INFaaS++".
``--trigger-gap 0.03`` reschedules as the cluster's LlumSched does by default: the trigger
on every status, passes at least that gap apart, the rounds (``--reschedule-every``) as the
backstop; rows then also carry the reaction times (status to first migration order).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

SYSTEMS: dict[str, dict[str, Any]] = {
    "infaas++": {"dispatch": "infaas++"},
    "llumnix": {"dispatch": "llumnix", "migration": True},
    "llumnix dst_queue=all": {"dispatch": "llumnix", "migration": True, "rescheduling": {"dst_queue": "all"}},
    "llumnix pairing=stable": {"dispatch": "llumnix", "migration": True, "rescheduling": {"pairing": "stable"}},
    "llumnix pairing=even": {"dispatch": "llumnix", "migration": True, "rescheduling": {"pairing": "even"}},
    "llumnix min_tokens_left=4 pairing=even": {"dispatch": "llumnix", "migration": True,
                                               "rescheduling": {"min_tokens_left": 4, "pairing": "even"}},
    "llumnix in_threshold=6": {"dispatch": "llumnix", "migration": True, "rescheduling": {"in_threshold": 6.0}},
    "llumnix no migration": {"dispatch": "llumnix"},
    "llumnix min_tokens_left=2": {"dispatch": "llumnix", "migration": True, "rescheduling": {"min_tokens_left": 2}},
    "llumnix min_tokens_left=4": {"dispatch": "llumnix", "migration": True, "rescheduling": {"min_tokens_left": 4}},
    "llumnix min_tokens_left=8": {"dispatch": "llumnix", "migration": True, "rescheduling": {"min_tokens_left": 8}},
}


def run(system: str, pairs: Any, n: int, rate: float, seed: int, blocks: int, block_size: int,
        watermark: float = 0.01, instances: int = 2, status_interval_s: float = 0.05,
        reschedule_every: int = 2, trigger_gap_s: float | None = None,
        calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    sim = simulate(system, pairs, n, rate, seed, blocks, block_size, watermark, instances, status_interval_s,
                   reschedule_every, trigger_gap_s, calibration)
    out = sim.summary()
    m = out["migrations"]
    reaction = (out.get("rescheduling") or {}).get("reaction_s") or {}
    moved = {r.request_id for r in sim.metrics.migrations if r.committed}
    return {"preemptions": out["num_preemptions"], "migrations": m["num_committed"], "aborted": m["num_aborted"],
            "moved": len(moved), "abort_reasons": m["abort_reasons"],
            "ttft_p99": out["ttft"]["p99"], "reaction_p50": reaction.get("p50") if reaction.get("count") else None,
            "reaction_p99": reaction.get("p99") if reaction.get("count") else None}


def simulate(system: str, pairs: Any, n: int, rate: float, seed: int, blocks: int, block_size: int,
             watermark: float = 0.01, instances: int = 2, status_interval_s: float = 0.05,
             reschedule_every: int = 2, trigger_gap_s: float | None = None,
             calibration: dict[str, Any] | None = None) -> Any:
    """The simulator after one run of ``system`` (``run``'s arguments). ``calibration``: the
    information path's delays (``calibrate_info_path.py``'s ``simulator`` section)."""
    from llumnix.bench.sim_vs_real import sim_trace
    from llumnix.sim.cluster import ClusterConfig
    from llumnix.sim.config import SystemSpec
    from llumnix.sim.latency import get_latency_model
    from llumnix.sim.policy_bridge import make_policy
    from llumnix.sim.simulator import Simulator

    d = SYSTEMS[system]
    cal = calibration or {}
    opts = {"rescheduling": d["rescheduling"]} if "rescheduling" in d else {}
    spec = SystemSpec(system, d["dispatch"], enable_migration=d.get("migration", False), options=opts)
    cluster = ClusterConfig(num_instances=instances, num_blocks=blocks, block_size=block_size, max_num_seqs=32,
                            chunked_prefill=True, max_model_len=blocks * block_size, watermark=watermark,
                            status_interval_s=status_interval_s, reschedule_every=reschedule_every,
                            trigger_gap_s=trigger_gap_s, status_delay_s=cal.get("status_delay_s") or 0.0,
                            migration_start_s=cal.get("migration_start_s") or 0.0)
    latency = get_latency_model("a10-llama7b-serving")
    if cal.get("stage_overhead_s") is not None:
        latency = dataclasses.replace(latency, migration=dataclasses.replace(
            latency.migration, stage_overhead_s=cal["stage_overhead_s"], last_stage_overhead_s=None))
    sim = Simulator(cluster, latency, make_policy(spec, cluster, seed=seed),
                    sim_trace(pairs, n, rate, seed))
    sim.run()
    return sim


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _reactions(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median over seeds of each run's reaction P50 and P99 (None: no trigger, or no source)."""
    p50 = [r["reaction_p50"] for r in runs if r["reaction_p50"] is not None]
    p99 = [r["reaction_p99"] for r in runs if r["reaction_p99"] is not None]
    return {"reaction_p50_median": float(np.median(p50)) if p50 else None,
            "reaction_p99_median": float(np.median(p99)) if p99 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rates", default="4,8,12,16")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--watermark", type=float, default=0.01, help="admission watermark (10 blocks: 0.01 is 0 blocks)")
    ap.add_argument("--status-interval", type=float, default=0.05,
                    help="s between status reports (the real cluster's busy push: 0.25)")
    ap.add_argument("--reschedule-every", type=int, default=2,
                    help="status rounds per rescheduling round (the real cluster: 0.5 s)")
    ap.add_argument("--trigger-gap", type=float, default=None,
                    help="triggered rescheduling, passes at least this many s apart (the cluster's default: 0.03)")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="calibrate_info_path.py's JSON: its status delay, migration start and stage cost")
    ap.add_argument("--paired-with", default=None,
                    help="also each system's paired difference in preemptions against this one (same seeds)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from llumnix.bench.cluster_bench import ClusterBenchSettings, scaled_pairs
    from llumnix.sim.sharegpt import sharegpt_lengths

    pairs = scaled_pairs(ClusterBenchSettings(), *sharegpt_lengths("smollm2"))
    systems = a.systems.split(",")
    cal = json.loads(a.calibration.read_text())["simulator"] if a.calibration else None
    rows = []
    for rate in (float(x) for x in a.rates.split(",")):
        per: dict[str, np.ndarray] = {}
        runs: dict[str, list[dict[str, Any]]] = {}
        for name in systems:
            runs[name] = [run(name, pairs, a.requests, rate, s, a.blocks, a.block_size, a.watermark, a.instances,
                              a.status_interval, a.reschedule_every, a.trigger_gap, cal) for s in range(a.seeds)]
            per[name] = np.array([r["preemptions"] for r in runs[name]])
        base = per["infaas++"]
        for name in systems:
            p = per[name]
            diff = p - base
            boot = np.random.default_rng(0).choice(diff, (2000, diff.size)).mean(1)
            blocks3 = [p[i:i + 3].sum() <= base[i:i + 3].sum() for i in range(0, a.seeds - 2, 3)]
            rows.append({"rate": rate, "system": name, "seeds": a.seeds, "requests": a.requests,
                         "preemptions": int(p.sum()), "per_request": float(p.sum() / (a.seeds * a.requests)),
                         "per_run_mean": float(p.mean()), "per_run_sd": float(p.std()),
                         "diff_vs_infaas_mean": float(diff.mean()),
                         "diff_ci95": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
                         "p_meet_at_most_with_3_seeds": float(np.mean(blocks3)),
                         "ratio_vs_infaas": float(p.sum() / base.sum()) if base.sum() else None,
                         "migrations": sum(r["migrations"] for r in runs[name]),
                         "aborted": sum(r["aborted"] for r in runs[name]),
                         "moved": sum(r["moved"] for r in runs[name]),
                         "abort_reasons": _sum_counts([r["abort_reasons"] for r in runs[name]]),
                         "ttft_p99_median": float(np.median([r["ttft_p99"] for r in runs[name]])),
                         **_reactions(runs[name])})
            if a.paired_with:
                other = p - per[a.paired_with]
                boot = np.random.default_rng(0).choice(other, (2000, other.size)).mean(1)
                rows[-1]["paired_with"] = {"system": a.paired_with, "diff_mean": float(other.mean()),
                                           "diff_ci95": [float(np.quantile(boot, 0.025)),
                                                         float(np.quantile(boot, 0.975))]}
            r = rows[-1]
            print(f"rate {rate:5.1f} {name:>24}: {r['preemptions']:5d} preempt ({r['per_request']:.2f}/req, "
                  f"run mean {r['per_run_mean']:.2f} sd {r['per_run_sd']:.2f}); vs infaas++ "
                  f"{r['diff_vs_infaas_mean']:+.2f} [{r['diff_ci95'][0]:+.2f}, {r['diff_ci95'][1]:+.2f}] per run, "
                  f"ratio {r['ratio_vs_infaas'] or 0:.2f}, P(3 seeds <=) {r['p_meet_at_most_with_3_seeds']:.2f}; "
                  f"migrations {r['migrations']} + {r['aborted']} aborted, {r['moved']} requests moved; TTFT P99 median {r['ttft_p99_median']:.2f} s"
                  + (f"; reaction P50/P99 median {r['reaction_p50_median'] * 1e3:.0f}/"
                     f"{r['reaction_p99_median'] * 1e3:.0f} ms" if r["reaction_p50_median"] is not None else ""),
                  flush=True)
    if a.out:
        a.out.write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
