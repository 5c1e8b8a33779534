"""One paced engine against the simulator on the same trace, request by request and step
by step (issue 45: why the simulator under-predicts the paced cluster).

The real side is one engine in this process: the tiny model (``tiny_model.py``), paced
(``engine/pace.py``), driven on the wall clock with ``paced_scale.sh``'s sizing and
``bench cluster``'s trace (``draw_trace``: the same lengths and arrivals the cluster and
``--with-sim`` get), each request added at its arrival time. No gateway, no Ray: what
differs from the simulator here is the engine's own cadence. The simulated side is
``sim_vs_real.simulate``'s one instance on the same trace. Per request: arrival, first
token, preemptions, finish; per step: when it ended, its batch, the running and waiting
requests and the blocks in use, the modeled time against the step's real cycle.

    python -m benchmarks.cluster.paced_match --seeds 0,1,2 --load 0.85 --capacity 1.0 --out F.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.bench.cluster_bench import ClusterBenchSettings, draw_trace, pace_latency, trace_pairs
from llumnix.bench.cluster_report import pct

SYSTEM = "infaas++"


def settings(model: str, pace: str, blocks: int) -> ClusterBenchSettings:
    """``paced_scale.sh``'s sizing, one instance."""
    return ClusterBenchSettings(model=model, instances=1, num_blocks=blocks, scale=1.0, max_input=512,
                                max_output=512, pace=pace, trace_tokenizer="smollm2", systems=(SYSTEM,))


def _step_row(t: float, engine: Any, batch: Any, modeled: float) -> dict[str, Any]:
    kv, sched = engine.kv, engine.scheduler
    return {"t": t, "prefill": bool(batch.is_prefill), "n": batch.num_entries,
            "preempted": len(batch.preempted_request_ids), "running": len(sched.running),
            "waiting": len(sched.waiting), "used": kv.num_used_blocks, "modeled": modeled}


def _request_row(m: Any, t0: float) -> dict[str, Any]:
    return {"arrival": m.arrival_time - t0, "first_token": (m.first_token_time or m.finish_time) - t0,
            "finish": m.finish_time - t0, "preemptions": m.num_preemptions, "prompt": m.num_prompt_tokens,
            "output": m.num_output_tokens, "instance": m.instance_id}


def real_run(s: ClusterBenchSettings, trace: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, Any]:
    """The trace through one paced engine on the wall clock."""
    import torch

    from llumnix.bench.profile import synthetic_prompt
    from llumnix.config.system import SystemConfig
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.llm import LLM

    torch.set_num_threads(1)  # as an instance actor
    eng_cfg = SystemConfig.from_dict(s.system_doc(SYSTEM)).engine
    llm = LLM(s.model, instance_id="instance-0", **eng_cfg.llm_kwargs())
    engine, pacer = llm.engine, llm.engine.pacer
    assert pacer is not None
    vocab = llm.loaded.config.vocab_size
    prompts, outputs, times = trace
    n = len(times)
    steps: list[dict[str, Any]] = []
    reqs: dict[str, dict[str, Any]] = {}
    t0 = engine.clock.now()
    i = 0
    while len(reqs) < n:
        now = engine.clock.now() - t0
        while i < n and times[i] <= now:
            engine.add_request(f"req-{i}", synthetic_prompt(int(prompts[i]), i + 1, vocab),
                               SamplingParams(max_tokens=int(outputs[i]), ignore_eos=True),
                               arrival_time=t0 + float(times[i]))
            i += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, float(times[i]) - now))
            continue
        for out in engine.step():
            if out.metrics is not None:
                reqs[out.request_id] = _request_row(out.metrics, t0)
        batch = engine.last_batch
        if batch is not None and not batch.is_empty:
            steps.append(_step_row(engine.clock.now() - t0, engine, batch, pacer.modeled_s(batch)))
    return {"requests": reqs, "steps": steps, "pace": pacer.counts()}


def sim_run(s: ClusterBenchSettings, trace: tuple[np.ndarray, np.ndarray, np.ndarray], rate: float,
            seed: int, name: str = SYSTEM) -> dict[str, Any]:
    """The trace through the simulator as ``sim_vs_real.simulate`` runs it, every step recorded."""
    from llumnix.bench.sim_vs_real import InfoPath
    from llumnix.core.config import CacheConfig
    from llumnix.sim.cluster import ClusterConfig
    from llumnix.sim.config import parse_system
    from llumnix.sim.policy_bridge import make_policy
    from llumnix.sim.simulator import Simulator
    from llumnix.sim.workloads import Trace

    doc = s.system_doc(name)
    spec = parse_system(name, {k: v for k, v in doc.items() if k != "deployment"})
    info = InfoPath.of(doc)
    assert spec.system is not None
    eng = spec.system.engine
    cluster = ClusterConfig(num_instances=s.instances, num_blocks=s.num_blocks, block_size=s.block_size,
                            max_num_seqs=s.max_num_seqs, chunked_prefill=eng.chunked_prefill,
                            max_num_batched_tokens=eng.num_batched_tokens, max_model_len=s.num_blocks * s.block_size,
                            watermark=CacheConfig.watermark, status_interval_s=info.status_interval_s,
                            reschedule_every=info.reschedule_every, trigger_gap_s=info.trigger_gap_s)
    prompts, outputs, times = trace
    tr = Trace("paced-match", rate, seed, times, prompts, outputs, np.zeros(len(times), np.int64))
    latency = pace_latency(s.pace or "")
    sim = Simulator(cluster, latency, make_policy(spec, cluster, seed=seed), tr)
    steps: list[dict[str, Any]] = []
    on_step_end = sim.on_step_end

    def recorded(ev: Any) -> Any:
        inst = ev.target
        batch = inst._batch  # noqa: SLF001 - the step that just ended, before finish_step clears it
        modeled = inst._output.elapsed  # noqa: SLF001
        out = on_step_end(ev)
        steps.append(_step_row(sim.clock.now(), inst.engine, batch, modeled))
        return out

    from llumnix.sim.events import EventKind

    sim.loop.on(EventKind.STEP_END, recorded)
    summary = sim.run()
    # a request's metrics carry no id; its arrival time (the trace's, unique) names it
    index = {float(t): k for k, t in enumerate(times)}
    reqs = {f"req-{index[m.arrival_time]}": _request_row(m, 0.0) for m in sim.metrics.requests}
    gaps = list(sim.metrics.token_gaps)
    return {"requests": reqs, "steps": steps, "summary": {  # percentiles as the bench takes a run's
        "num_preemptions": summary["num_preemptions"],
        "ttft_p99_s": pct([x["first_token"] - x["arrival"] for x in reqs.values()], 99),
        "ttft_mean_s": float(np.mean([x["first_token"] - x["arrival"] for x in reqs.values()])),
        "itl_p50_s": pct(gaps, 50), "itl_p99_s": pct(gaps, 99),
        "migrations": summary["migrations"]["num_committed"]}}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Preemptions, TTFT P50/P99/max, the run's length, the mean step cycle against its
    modeled time (decode steps only)."""
    r = run["requests"].values()
    ttft = np.array([x["first_token"] - x["arrival"] for x in r])
    steps = run["steps"]
    t = np.array([x["t"] for x in steps])
    cycle = np.diff(t)
    modeled = np.array([x["modeled"] for x in steps])[1:]
    decode = np.array([not x["prefill"] for x in steps])[1:]
    busy = cycle < modeled * 3  # a step right after the previous one (no idle gap between)
    sel = decode & busy
    return {"num_preemptions": int(sum(x["preemptions"] for x in r)),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "ttft_max_s": float(ttft.max()), "makespan_s": float(max(x["finish"] for x in r)),
            "num_steps": len(steps), "decode_cycle_over_modeled": float(np.median(cycle[sel] / modeled[sel]))
            if sel.any() else None, "max_used_blocks": int(max(x["used"] for x in steps))}


def per_request(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Request by request: TTFT and finish differences (real - simulated), preemption counts
    that differ, and the first request (by arrival) where the two runs part."""
    rr, ss = real["requests"], sim["requests"]
    ids = sorted(set(rr) & set(ss), key=lambda k: rr[k]["arrival"])
    d_ttft = np.array([(rr[k]["first_token"] - rr[k]["arrival"]) - (ss[k]["first_token"] - ss[k]["arrival"])
                       for k in ids])
    d_fin = np.array([(rr[k]["finish"] - rr[k]["arrival"]) - (ss[k]["finish"] - ss[k]["arrival"]) for k in ids])
    differ = [k for k in ids if rr[k]["preemptions"] != ss[k]["preemptions"]]
    parted = next((k for k in ids if rr[k]["preemptions"] != ss[k]["preemptions"]
                   or abs((rr[k]["first_token"] - ss[k]["first_token"])) > 0.5), None)
    return {"num_requests": len(ids), "ttft_diff_p50_s": float(np.median(d_ttft)),
            "e2e_diff_p50_s": float(np.median(d_fin)), "e2e_ratio_p50": float(np.median(
                [(rr[k]["finish"] - rr[k]["arrival"]) / (ss[k]["finish"] - ss[k]["arrival"]) for k in ids])),
            "num_preemption_counts_differ": len(differ), "first_parted": parted,
            "first_parted_arrival_s": None if parted is None else rr[parted]["arrival"]}


def against_record(path: Path, sim_seeds: int) -> list[dict[str, Any]]:
    """Each real run of a ``bench cluster`` record beside the simulator's run of the same
    trace seed (paired) and the mean of ``sim_seeds`` simulated seeds at its load."""
    from llumnix.bench.sim_vs_real import settings_of

    record = json.loads(path.read_text())
    s = settings_of(record)
    pairs = trace_pairs(s)
    cap = float(record["capacity"]["capacity_req_s"])
    rows = []
    for sys_rec in record["systems"]:
        for r in sys_rec["runs"]:
            rate, n, name = r["load"] * cap, int(r["num_requests"]), sys_rec["system"]
            same = sim_run(s, draw_trace(pairs, n, rate, r["seed"]), rate, r["seed"], name)["summary"]
            many = [sim_run(s, draw_trace(pairs, n, rate, k), rate, k, name)["summary"] for k in range(sim_seeds)]
            real = {"num_preemptions": r["num_preemptions"], "ttft_p99_s": r["ttft_s"]["p99"],
                    "gateway_ttft_mean_s": r.get("gateway_ttft_mean_s"),
                    "itl_p50_s": r["itl_s"]["p50"], "itl_p99_s": r["itl_s"]["p99"],
                    "migrations": r["migrations_committed"]}
            mean = {k: float(np.mean([m[k] for m in many])) for k in same}
            rows.append({"system": name, "load": r["load"], "seed": r["seed"], "real": real, "sim_same_seed": same,
                         f"sim_mean_{sim_seeds}": mean})
            print(f"{name} load {r['load']} seed {r['seed']}: real {real}\n  sim same seed {same}\n  "
                  f"sim mean {mean}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster.paced_match", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/llumnix/bench/tiny-paced"))
    ap.add_argument("--pace", default="a10-llama7b-serving")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--capacity", type=float, default=1.0, help="req/s of one instance (load x it is the rate)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--record", type=Path, help="a bench cluster cluster.json: its runs against the simulator's")
    ap.add_argument("--sim-seeds", type=int, default=10, help="with --record: simulated seeds for the mean")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.record is not None:
        a.out.write_text(json.dumps({"record": str(a.record), "rows": against_record(a.record, a.sim_seeds)},
                                    indent=1) + "\n")
        return 0
    s = settings(a.model, a.pace, a.blocks)
    pairs = trace_pairs(s)
    rate = a.load * a.capacity
    res: dict[str, Any] = {"settings": vars(a) | {"out": str(a.out)}, "runs": []}
    for seed in (int(x) for x in a.seeds.split(",")):
        trace = draw_trace(pairs, a.requests, rate, seed)
        sim = sim_run(s, trace, rate, seed)
        row: dict[str, Any] = {"seed": seed, "sim": sim, "sim_summary": summarize(sim)}
        print(f"seed {seed} sim  {row['sim_summary']}", flush=True)
        if not a.sim_only:
            import os

            load0 = os.getloadavg()[0]
            real = real_run(s, trace)
            row |= {"real": real, "real_summary": summarize(real), "loadavg": [load0, os.getloadavg()[0]]}
            row["per_request"] = per_request(real, sim)
            print(f"seed {seed} real {row['real_summary']} pace {real['pace']} load {row['loadavg']}\n"
                  f"  per request {row['per_request']}", flush=True)
        res["runs"].append(row)
        a.out.write_text(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
