"""The slo predictor on the real CPU engine (issue 47): a real cluster (SmolLM2, 2
instances, the ``slo`` dispatch policy) behind the gateway on a real socket, fed the
``llumnix bench cluster`` trace (scaled ShareGPT, Poisson) at fractions of a probed
capacity. Records, per engine step, the time its instance's model predicted before
fitting it against the time it held the engine (``SLOPredictor.step_log``), and per
request the TTFT predicted at dispatch against the TTFT the client saw (first streamed
token; ``SLOPredictor.ttft_log``). During each run a third class that always sheds
(``shed``: a TTFT objective nothing meets, ``shed_share`` 1) sends a request now and then:
the time to its 429 at the client.

    PYTHONPATH=src .venv/bin/python benchmarks/slo/real_cluster.py --out /tmp/slo_real.json \\
        --summary benchmarks/slo/real_summary.json

Capacity: ``bench cluster``'s closed-loop probe (``probe_concurrency`` in flight), which
also warms the predictor up (its models start from the A10 seed). Loads alternate within a
round; rounds are seeds. Errors are |predicted / measured - 1|.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

SHED_CLASS = {"ttft_s": 0.0001, "tpot_s": 10.0, "shed_share": 1.0}
"""A class every request of which is shed (no prefill is that fast): the 429's timing."""


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def errors(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """(predicted, measured) pairs: relative error percentiles and the signed median."""
    rel = [abs(p / m - 1) for p, m in pairs if m > 0]
    signed = [p / m - 1 for p, m in pairs if m > 0]
    return {"n": len(rel), "p50": pct(rel, 0.5), "p90": pct(rel, 0.9),
            "signed_p50": statistics.median(signed) if signed else None}


def step_errors(log: list[tuple[float, Any, str]]) -> dict[str, Any]:
    kinds: dict[str, list[tuple[float, float]]] = {"prefill": [], "decode": [], "mixed": []}
    for pred, s, _ in log:
        kind = "mixed" if s.num_prefill_seqs and s.num_decode_seqs else "prefill" if s.num_prefill_seqs else "decode"
        kinds[kind].append((pred, s.seconds))
    return {**errors([(p, s.seconds) for p, s, _ in log]), "by_kind": {k: errors(v) for k, v in kinds.items() if v},
            "mean_s": statistics.fmean(s.seconds for _, s, _ in log) if log else None}


def noise_floor(log: list[tuple[float, Any, str]]) -> dict[str, Any]:
    """What no batch-shape model beats: each decode step predicted by the previous step of its
    instance when that was a decode step of the same batch size."""
    last: dict[str, Any] = {}
    pairs: list[tuple[float, float]] = []
    for _, s, iid in log:
        prev = last.get(iid)
        if prev is not None and not s.num_prefill_seqs and not prev.num_prefill_seqs \
                and prev.num_decode_seqs == s.num_decode_seqs:
            pairs.append((prev.seconds, s.seconds))
        last[iid] = s
    return errors(pairs)


async def one(client: Any, url: str, model: str, prompt: list[int], max_tokens: int, slo_class: str | None,
              out: dict[str, Any]) -> None:
    """One streamed completion: its id, the client's TTFT (first token: logprobs make every
    token a chunk), or its status and time to it when refused."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                            "temperature": 0, "ignore_eos": True, "logprobs": 0}
    if slo_class is not None:
        body["slo_class"] = slo_class
    t0 = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            await r.aread()
            out["answer_s"] = time.perf_counter() - t0
            out["retry_after"] = r.headers.get("retry-after")
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and "ttft_s" not in out:
                out["ttft_s"] = time.perf_counter() - t0
                out["id"] = chunk["id"]
    out["e2e_s"] = time.perf_counter() - t0


async def drive(url: str, model: str, reqs: list[Any], shed_every_s: float) -> tuple[list[dict], list[dict]]:
    """``reqs`` at their arrival times, and a shed-class request every ``shed_every_s``."""
    import httpx

    served: list[dict[str, Any]] = [{} for _ in reqs]
    shed: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()

        async def fire(i: int) -> None:
            await asyncio.sleep(max(0.0, reqs[i].arrival_s - (time.perf_counter() - t0)))
            await one(client, url, model, reqs[i].prompt, reqs[i].max_tokens, None, served[i])

        async def shedder() -> None:
            end = reqs[-1].arrival_s
            while time.perf_counter() - t0 < end:
                await asyncio.sleep(shed_every_s)
                rec: dict[str, Any] = {"sent_s": time.perf_counter() - t0}
                shed.append(rec)
                await one(client, url, model, reqs[0].prompt, 4, "shed", rec)

        await asyncio.gather(shedder(), *(fire(i) for i in range(len(reqs))))
    return served, shed


class Server:
    """What ``bench cluster``'s probe reads of a server (url, model, wait_idle), in-process."""

    def __init__(self, url: str, backend: Any) -> None:
        self.url, self.backend, self.model = url, backend, backend.model_name

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            gs = self.backend.gs
            if not any(s.running or s.waiting for s in gs.statuses.values()):
                time.sleep(0.3)
                return
            time.sleep(0.2)


def run_round(server: Server, settings: Any, pairs: Any, vocab: int, load: float, seed: int,
              capacity: float, n: int, shed_every_s: float, raw: list[Any] | None = None) -> dict[str, Any]:
    from llumnix.bench.cluster_bench import make_requests
    from llumnix.cluster.gc_watch import GCWatch

    pred = server.backend.gs.slo
    reqs = make_requests(settings, pairs, n, load * capacity, seed, vocab)
    before = len(pred.step_log)
    gcw = GCWatch()  # full collections in this process (the gateway's too) during the round
    load_avg = os.getloadavg()
    seen: dict[str, list[float]] = {}
    record = pred.record_ttft
    preempted_before = server.backend.gs.view()[0].num_preemptions

    def seen_at_dispatch(request_id: str, arrival_time: float, predicted_s: float) -> None:
        """What the dispatch saw of the first instance: its status's age (the view keeps the
        report's timestamp, wall clock) and the running and queued requests in its view."""
        v = server.backend.gs.view()[0]
        seen[request_id] = [time.time() - v.timestamp, len(v.running), len(v.waiting)]
        record(request_id, arrival_time, predicted_s)

    pred.record_ttft = seen_at_dispatch  # type: ignore[method-assign]
    try:
        served, shed = asyncio.run(drive(server.url, server.model, reqs, shed_every_s))
    finally:
        del pred.record_ttft  # the class's method again
    gcw.close()
    server.wait_idle()
    num_preempted = server.backend.gs.view()[0].num_preemptions - preempted_before
    steps = list(pred.step_log)[before:]
    if raw is not None:  # every step, for replaying the predictor offline
        raw.append({"load": load, "seed": seed, "steps": [[iid, p, *dataclasses.astuple(s)] for p, s, iid in steps],
                    "ttft": [[r.get("id"), r.get("ttft_s")] for r in served],
                    "ttft_pred": {r["id"]: pred.ttft_log[r["id"]] for r in served if r.get("id") in pred.ttft_log},
                    "seen": {r["id"]: seen[r["id"]] for r in served if r.get("id") in seen}})
    ttfts = [(pred.ttft_log[r["id"]][1], r["ttft_s"]) for r in served if r.get("id") in pred.ttft_log]
    shed_s = [r["answer_s"] for r in shed if r.get("status") == 429]
    return {"load": load, "seed": seed, "rate": load * capacity, "num_requests": n,
            "num_served": sum(1 for r in served if r.get("status") == 200), "step": step_errors(steps),
            "step_noise_floor": noise_floor(steps),
            "ttft": {**errors(ttfts), "measured_p50_s": pct([m for _, m in ttfts], 0.5),
                     "measured_p90_s": pct([m for _, m in ttfts], 0.9)},
            "num_preempted": num_preempted,
            "status_age_s": {"p50": pct([a for a, _, _ in seen.values()], 0.5),
                             "p90": pct([a for a, _, _ in seen.values()], 0.9),
                             "max": max((a for a, _, _ in seen.values()), default=None)},
            "shed": {"n": len(shed), "num_429": len(shed_s), "max_s": max(shed_s, default=None),
                     "p50_s": pct(shed_s, 0.5), "retry_after": sorted({r.get("retry_after") for r in shed} - {None}),
                     "statuses": sorted({r.get("status") for r in shed}),
                     "slowest": sorted(([round(r["answer_s"], 4), round(r["sent_s"], 2), i] for i, r in enumerate(shed)
                                        if "answer_s" in r), reverse=True)[:3]},
            "gateway_gc": gcw.stats(), "loadavg_before": list(load_avg), "loadavg_after": list(os.getloadavg())}


def pooled(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load, the errors over every step and every request of its rounds together (the
    issue's goals are per load): from the raw record (``--raw``'s, or an earlier run's file
    with ``--pooled FILE``)."""
    out: dict[str, Any] = {}
    for load in sorted({r["load"] for r in raw}):
        rs = [r for r in raw if r["load"] == load]
        steps = [(s[1], s[-1]) for r in rs for s in r["steps"]]
        ttfts = [(r["ttft_pred"][rid][1], m) for r in rs for rid, m in r["ttft"] if rid in r["ttft_pred"] and m]
        out[str(load)] = {"step": errors(steps), "ttft": errors(ttfts)}
    return out


def summarize(rounds: list[dict[str, Any]], loads: list[float], raw: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"pooled": pooled(raw)}
    pool = out["pooled"].values()
    for load in loads:
        rs = [r for r in rounds if r["load"] == load]

        def med(key: str, sub: str, rs: list[dict[str, Any]] = rs) -> dict[str, Any]:
            vals = [r[key][sub] for r in rs if r[key][sub] is not None]
            return {"median": statistics.median(vals) if vals else None, "min": min(vals, default=None),
                    "max": max(vals, default=None)}

        out[str(load)] = {"rounds": len(rs), "step_p50": med("step", "p50"), "step_p90": med("step", "p90"),
                          "ttft_p50": med("ttft", "p50"), "ttft_p90": med("ttft", "p90"),
                          "shed_max_s": max((r["shed"]["max_s"] for r in rs if r["shed"]["max_s"] is not None),
                                            default=None),
                          "num_shed": sum(r["shed"]["num_429"] for r in rs),
                          "num_shed_not_429": sum(r["shed"]["n"] - r["shed"]["num_429"] for r in rs)}
    steps = [r["step"] for r in rounds]
    out["goals"] = {  # pooled per load, as the issue states them; then the stricter every-round reading
        "step_p50<=0.10": all(p["step"]["p50"] is not None and p["step"]["p50"] <= 0.10 for p in pool),
        "step_p90<=0.25": all(p["step"]["p90"] is not None and p["step"]["p90"] <= 0.25 for p in pool),
        "ttft_p50<=0.25": all(p["ttft"]["p50"] is not None and p["ttft"]["p50"] <= 0.25 for p in pool),
        "every_round_step_p50<=0.10": all(s["p50"] is not None and s["p50"] <= 0.10 for s in steps),
        "every_round_step_p90<=0.25": all(s["p90"] is not None and s["p90"] <= 0.25 for s in steps),
        "every_round_ttft_p50<=0.25": all(r["ttft"]["p50"] is not None and r["ttft"]["p50"] <= 0.25 for r in rounds),
        "every_shed_429_within_50ms": all(r["shed"]["n"] == r["shed"]["num_429"] and (r["shed"]["max_s"] or 0) <= 0.05
                                          for r in rounds)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/slo_real_cluster.json")
    p.add_argument("--summary", default=None, help="also write the summary (no per-round detail) here")
    p.add_argument("--loads", default="0.6,0.85")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--run-seconds", type=float, default=40.0, help="each run offers this many seconds of capacity")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks per instance (default: the engine's)")
    p.add_argument("--instances", type=int, default=2,
                   help="instances (1: the engine has the machine's cores to itself, no neighbour's steps in its times)")
    p.add_argument("--probe-requests", type=int, default=64)
    p.add_argument("--shed-every-s", type=float, default=1.0)
    p.add_argument("--raw", default=None, help="write every step and request here (large; not committed)")
    p.add_argument("--pooled", default=None, metavar="RAW", help="print the pooled errors of an earlier run's --raw file; run nothing")
    args = p.parse_args(argv)
    if args.pooled:
        print(json.dumps(pooled(json.loads(Path(args.pooled).read_text())), indent=1))
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    import ray

    from llumnix.bench.cluster_bench import ClusterBenchSettings, scaled_pairs
    from llumnix.bench.cluster_probe import probe_capacity
    from llumnix.bench.machine import machine_info
    from llumnix.cluster.gateway_client import ClusterBackend
    from llumnix.cluster.launcher import ClusterConfig, start_cluster
    from llumnix.gateway.inprocess import InProcessGateway
    from llumnix.model import load_tokenizer
    from llumnix.policy.slo import SLOConfig
    from llumnix.sim.sharegpt import sharegpt_lengths

    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    settings = ClusterBenchSettings(probe_requests=args.probe_requests)
    pairs = scaled_pairs(settings, *sharegpt_lengths(settings.model))
    slo = {"classes": {**SLOConfig().classes, "shed": SHED_CLASS}}
    slo["classes"] = {k: (dataclasses.asdict(v) if not isinstance(v, dict) else v) for k, v in slo["classes"].items()}
    engine: dict[str, Any] = {"device": "cpu", "enable_prefix_caching": False, "block_size": settings.block_size,
                              "max_num_seqs": settings.max_num_seqs}
    if args.num_blocks is not None:
        engine["num_blocks"] = args.num_blocks
    scheduling = {"dispatch": {"policy": "slo"}, "rescheduling": {"enabled": False}, "slo": slo}
    tok = load_tokenizer(settings.model)
    t_start = time.perf_counter()
    record: dict[str, Any] = {"machine": machine_info(with_torch=False), "loadavg_start": list(os.getloadavg()),
                              "settings": {"model": settings.model, "instances": args.instances, "engine": engine,
                                           "scheduling": scheduling, "trace": dataclasses.asdict(settings),
                                           **vars(args)}}
    cluster = start_cluster(ClusterConfig(model=settings.model, instances=args.instances, engine=engine, scheduling=scheduling,
                                          namespace=f"slo-real-{time.time_ns()}"))
    try:
        backend = ClusterBackend(cluster.llumsched, cluster.instances, cluster.info, tok)
        with InProcessGateway(backend, slo=SLOConfig(**slo)) as url:
            server = Server(url, backend)
            deadline = time.time() + 120
            while time.time() < deadline and (backend.gs is None or len(backend.gs.statuses) < args.instances):
                time.sleep(0.2)
            cap = probe_capacity(settings, server, pairs, tok.vocab_size)  # type: ignore[arg-type]
            record["capacity"] = cap
            print(f"capacity {cap['capacity_req_s']:.2f} req/s", flush=True)
            n = max(16, round(args.run_seconds * cap["capacity_req_s"]))
            rounds: list[dict[str, Any]] = []
            raw: list[Any] = []
            for k, seed in enumerate(seeds):
                for load in loads if k % 2 == 0 else loads[::-1]:  # alternate the arms
                    r = run_round(server, settings, pairs, tok.vocab_size, load, seed, cap["capacity_req_s"], n,
                                  args.shed_every_s, raw)
                    rounds.append(r)
                    # the driver's records of the round are long-lived: out of the collector's way,
                    # so that a full collection in this process (the gateway's too) does not walk them
                    # (run 6 of session 36: a 429 at 59 ms beside a 50 ms full collection)
                    gc.collect()
                    gc.freeze()
                    print(f"load {load} seed {seed}: step p50 {r['step']['p50']:.3f} p90 {r['step']['p90']:.3f}"
                          f" | ttft p50 {r['ttft']['p50']} p90 {r['ttft']['p90']} | shed max {r['shed']['max_s']}"
                          f" | loadavg {r['loadavg_after'][0]:.1f}", flush=True)
                    record["rounds"] = rounds
                    Path(args.out).write_text(json.dumps(record, indent=1, default=str))
                    if args.raw:
                        Path(args.raw).write_text(json.dumps(raw, default=str))
            record["summary"] = summarize(rounds, loads, raw)
    finally:
        cluster.shutdown()
        ray.shutdown()
    record["wall_s"] = time.perf_counter() - t_start
    Path(args.out).write_text(json.dumps(record, indent=1, default=str))
    if args.summary:  # the record is small (percentiles per round): committed whole
        Path(args.summary).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps(record["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
