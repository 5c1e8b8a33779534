"""PD disaggregation on the real CPU cluster (issue 33): `llumnix serve` with 1 prefill + 1
decode instance (`--prefill-instances 1`) against 2 co-located (mixed) instances, SmolLM2,
on `benchmarks/chunked_serve.sh`'s workload (24 requests, ShareGPT-like lengths: prompts
300 words on average up to 1,500, outputs 64 up to 128; chunked prefill on, serve's default).

The rate rule, fixed before any run: the co-located cluster's capacity is measured first
(the seed-0 trace's 24 requests arriving at once; capacity = completed requests / makespan),
and every run uses ``--load`` (default 0.6) x that capacity, Poisson arrivals. Systems
alternate within each seed (co-located, then PD), three seeds.

Systems: co-located (2 mixed), pd (1 prefill + 1 decode; a request handed off behind
prefill work is paused at once and copied in one stage) and pd-live (the same, always by
the live migration's pre-copy stages).

Per run: TTFT P99, inter-token latency P50/P99, TPOT, e2e (``llumnix bench serve``'s
client-side measures), and from ``/admin/cluster`` the hand-offs (done / failed / found the
decode pool full) and the hand-off stall (each migration's downtime: the request's pause on
the prefill instance to its first step on the decode instance), set beside one decode step
(PD's inter-token P50: the decode instance's step). The load average is recorded per run:
the machine is shared.

    python benchmarks/pd_cluster/run.py [--seeds 1,2,3] [--load 0.6] [--systems colocated,pd,pd-adaptive] [--out DIR]

Writes ``DIR/pd_cluster.json`` (default ``./llumnix-results/pd_cluster``, outside the
checkout's committed files) and prints the table and the goals.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from llumnix.bench.machine import RESULTS_DIR, machine_info, write_result
from llumnix.bench.serve_bench import plan, run_load, summarize
from llumnix.cluster.startup import free_port, wait_until_healthy
from llumnix.core.errors import LlumnixError

WORKLOAD = {"num_requests": 24, "arrival": "poisson", "cv": 1.0, "lengths": "sharegpt", "input_len": 300,
            "output_len": 64, "max_input": 1500, "max_output": 128}
"""benchmarks/chunked_serve.sh's `llumnix bench serve` flags."""
LIVE_CONFIG = "/tmp/pd_cluster_live.yaml"
ADAPTIVE_CONFIG = "/tmp/pd_cluster_adaptive.yaml"
ADAPTIVE = {"min_decode": 0, "lend_above_tokens": 1024, "reclaim_below_tokens": 256}
"""pd-adaptive's thresholds for this workload (prompts of about 400 tokens): the decode
instance is lent (takes prefills) when more than about three prompts queue per
prefill-taking instance, reclaimed when under one remains; ``min_decode`` 0 lets a 1 + 1
cluster lend its only decode instance (co-located while the queue is long)."""
SYSTEMS = {"colocated": ["--instances", "2"], "pd": ["--instances", "2", "--prefill-instances", "1"],
           "pd-live": ["--instances", "2", "--prefill-instances", "1", "--config", LIVE_CONFIG],
           "pd-adaptive": ["--instances", "2", "--prefill-instances", "1", "--pd", "adaptive",
                           "--config", ADAPTIVE_CONFIG]}
"""pd: a hand-off behind prefill work on the prefill instance pauses the request at once and
copies it in one stage (the default; a prompt in chunks is pre-copied chunk by chunk from its
first full block); pd-live: always the live migration (pre-copy while the request decodes
beside the prefill chunks); pd-adaptive: pd with adaptive roles (``ADAPTIVE``)."""


class Serve:
    """`llumnix serve` on a free port, until the block ends."""

    def __init__(self, name: str, flags: list[str]) -> None:
        self.name, self.flags = name, flags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Serve:
        exe = Path(sys.executable).with_name("llumnix")
        self.log = open(f"/tmp/pd_cluster_{self.name}.log", "w")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen([str(exe), "serve", "--port", str(self.port), *self.flags],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until_healthy(self.url, self.proc, 300.0, f"llumnix serve ({self.name}; log {self.log.name})")
        except LlumnixError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def model(self) -> str:
        return str(httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"])

    def cluster(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/admin/cluster", timeout=10).json())


def one_run(srv: Serve, rate: float, seed: int, num_requests: int | None = None) -> dict[str, Any]:
    reqs = plan(num_requests or WORKLOAD["num_requests"], rate, WORKLOAD["arrival"], WORKLOAD["cv"], WORKLOAD["lengths"],
                WORKLOAD["input_len"], WORKLOAD["output_len"], WORKLOAD["max_input"], WORKLOAD["max_output"], seed)
    load0 = os.getloadavg()[0]
    records, duration = asyncio.run(run_load(srv.url, srv.model(), reqs, show_progress=False))
    info = srv.cluster()
    pd = info.get("pd") or {}
    s = summarize(records, duration)
    return {"seed": seed, "rate": rate, "load_avg_1m": [load0, os.getloadavg()[0]], "summary": s,
            "pd": {k: pd.get(k) for k in ("mode", "roles", "handoffs_done", "handoffs_failed", "handoffs_ended_first",
                                          "handoffs_waiting", "handoff_abort_reasons", "handoff_downtime_s",
                                          "lends", "reclaims", "flips", "role_resends", "role_changes")},
            "migrations": info.get("migrations", {}).get("committed")}


def capacity(seed: int = 0) -> dict[str, Any]:
    """The co-located cluster's completed requests per second with the whole trace at once."""
    with Serve("capacity", SYSTEMS["colocated"]) as srv:
        run = one_run(srv, 1000.0, seed)
    s = run["summary"]
    return {"capacity_req_s": s["num_ok"] / s["duration_s"], "run": run}


def _med(values: list[float | None]) -> dict[str, float | None]:
    v = [x for x in values if x is not None]
    return {"median": statistics.median(v) if v else None, "min": min(v, default=None), "max": max(v, default=None)}


FIGURES = {"ttft_p50_s": ("ttft_s", "p50"), "ttft_p99_s": ("ttft_s", "p99"), "itl_p50_s": ("itl_s", "p50"),
           "itl_p99_s": ("itl_s", "p99"), "tpot_p50_s": ("tpot_s", "p50"), "tpot_p99_s": ("tpot_s", "p99"),
           "tpot_mean_s": ("tpot_s", "mean"), "e2e_mean_s": ("e2e_s", "mean"), "e2e_p99_s": ("e2e_s", "p99")}


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system, rs in runs.items():
        out[system] = {name: _med([r["summary"][k][stat] for r in rs]) for name, (k, stat) in FIGURES.items()}
        out[system]["num_ok"] = sum(r["summary"]["num_ok"] for r in rs)
        out[system]["num_requests"] = sum(r["summary"]["num_requests"] for r in rs)
        if system != "colocated":
            out[system]["handoffs_done"] = [r["pd"]["handoffs_done"] for r in rs]
            out[system]["handoffs_failed"] = [r["pd"]["handoffs_failed"] for r in rs]
            out[system]["handoffs_waiting"] = [r["pd"]["handoffs_waiting"] for r in rs]
            out[system]["handoffs_ended_first"] = [r["pd"]["handoffs_ended_first"] for r in rs]
            out[system]["handoff_downtime_p50_s"] = _med([r["pd"]["handoff_downtime_s"]["p50"] for r in rs])
            out[system]["handoff_downtime_p99_s"] = _med([r["pd"]["handoff_downtime_s"]["p99"] for r in rs])
            out[system]["role_changes"] = [{k: r["pd"].get(k) for k in ("lends", "reclaims", "flips", "role_resends")}
                                           for r in rs]
    for system in runs:
        if system == "colocated":
            continue
        pairs = list(zip(runs.get("colocated", []), runs[system], strict=False))  # same seed, run side by side
        ratio = {name: _med([p["summary"][k][stat] / c["summary"][k][stat] for c, p in pairs
                             if c["summary"][k][stat] and p["summary"][k][stat] is not None])
                 for name, (k, stat) in FIGURES.items()}
        itl, ttft = ratio["itl_p99_s"]["median"], ratio["ttft_p99_s"]["median"]
        out[f"{system}_over_colocated"] = ratio
        out[f"{system}_goals"] = {"itl_p99_at_most_half": None if itl is None else itl <= 0.5,
                                  "ttft_p99_at_most_1.2x": None if ttft is None else ttft <= 1.2}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--load", type=float, default=0.6, help="the rate as a fraction of the measured capacity")
    ap.add_argument("--capacity", type=float, default=None, help="skip the probe: this capacity (req/s)")
    ap.add_argument("--out", default=f"{RESULTS_DIR}/pd_cluster")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"some of {', '.join(SYSTEMS)}")
    ap.add_argument("--num-requests", type=int, default=None,
                    help="requests per run, the trace's first N (default the workload's 24; the capacity probe keeps 24)")
    args = ap.parse_args()
    Path(LIVE_CONFIG).write_text("scheduling:\n  pd:\n    stop_and_copy_behind_prefill: false\n")
    Path(ADAPTIVE_CONFIG).write_text("scheduling:\n  pd:\n" + "".join(f"    {k}: {v}\n" for k, v in ADAPTIVE.items()))
    systems = {name: SYSTEMS[name] for name in args.systems.split(",")}
    t0 = time.time()
    probe = None if args.capacity is not None else capacity()
    cap = args.capacity if probe is None else probe["capacity_req_s"]
    rate = args.load * cap
    print(f"capacity {cap:.3f} req/s (co-located, 24 at once) -> rate {rate:.3f} req/s", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for seed in (int(x) for x in args.seeds.split(",")):
        for system, flags in systems.items():
            with Serve(system, flags) as srv:
                r = one_run(srv, rate, seed, args.num_requests)
            runs[system].append(r)
            s = r["summary"]
            print(f"seed {seed} {system:9s} ok {s['num_ok']}/{s['num_requests']}  TTFT p99 {s['ttft_s']['p99']:.3f}  "
                  f"ITL p50 {s['itl_s']['p50']:.3f} p99 {s['itl_s']['p99']:.3f}  TPOT {s['tpot_s']['mean']:.3f}  "
                  f"e2e {s['e2e_s']['mean']:.2f}  load {r['load_avg_1m'][0]:.1f}-{r['load_avg_1m'][1]:.1f}  "
                  f"hand-offs {r['pd'].get('handoffs_done')}  role changes {r['pd'].get('lends')}/"
                  f"{r['pd'].get('reclaims')}/{r['pd'].get('flips')}", flush=True)
    result = {"machine": machine_info(with_torch=False), "workload": WORKLOAD, "systems": systems,
              "num_requests": args.num_requests or WORKLOAD["num_requests"],
              "rule": f"rate = {args.load} x the co-located capacity (the seed-0 trace at once)",
              "adaptive": ADAPTIVE,
              "capacity_req_s": cap, "capacity_probe": probe, "rate_req_s": rate, "runs": runs,
              "summary": summary(runs), "wall_s": time.time() - t0}
    print(json.dumps(result["summary"], indent=1))
    write_result(Path(args.out) / "pd_cluster.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
