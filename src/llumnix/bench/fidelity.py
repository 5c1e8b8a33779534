"""`llumnix bench fidelity`: one seeded trace on the real cluster and in the simulator.

For each load (light; near saturation, where migrations and preemptions happen) and
each system (infaas++ dispatch without migration, llumnix dispatch with migration),
the same requests (arrival times, prompt token ids, output lengths) are served by:

* the real cluster: 2 instance actors on Ray, LlumSched, the OpenAI gateway (as
  ``llumnix serve`` starts them), driven over HTTP with streamed completions;
* the simulator, with the profile ``llumnix profile`` measured and the same cluster
  settings (blocks, block size, batch limits, thresholds, status and rescheduling
  intervals), and one scheduling config dict for both.

The simulator's clock starts at the engine; a request's real TTFT also holds the
serving path (HTTP, LlumSched's dispatch, the Ray hops in and out, the SSE chunk).
That cost is measured on the idle cluster before each run (probes whose engine step
is found in the instance's step log) and added to the simulated TTFT and end-to-end
latency. Per metric the report gives sim, real and (sim - real) / real.
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import dataclasses
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.bench.serve_bench import sse_chunks
from llumnix.core.errors import LlumnixError
from llumnix.gateway.inprocess import InProcessGateway

MEAN_GOAL = 0.10
"""Largest relative error of a mean (TTFT, decode per token, end-to-end)."""
P99_GOAL = 0.25
"""Largest relative error of a P99."""
MEAN_METRICS = ("ttft_mean", "decode_mean", "e2e_mean")
P99_METRICS = ("ttft_p99", "decode_p99")
METRICS = ("ttft_mean", "ttft_p99", "decode_mean", "decode_p99", "e2e_mean", "e2e_p99",
           "num_migrations", "num_preemptions")
RANK_METRICS = ("ttft_mean", "ttft_p99", "decode_mean", "e2e_mean")


@dataclass(frozen=True)
class Load:
    name: str
    rate: float
    """Requests per second (Poisson)."""
    num_requests: int


@dataclass(frozen=True)
class FidelitySetup:
    """The cluster both sides run and the trace they serve."""

    model: str = "smollm2"
    num_instances: int = 2
    num_blocks: int = 48
    """KV blocks per instance: small, so the heavy load fills them (migrations, preemptions)."""
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    watermark: float = 0.01
    status_interval_s: float = 0.05
    """The instances' periodic status push (cluster/instance.py)."""
    reschedule_interval_s: float = 0.5
    """LlumSched's migration rounds."""
    migrate_out_threshold: float = 3.0
    threads_per_instance: int = 1
    prompt_tokens: tuple[int, int] = (16, 96)
    """Prompt lengths, uniform in [lo, hi]."""
    output_tokens: tuple[int, int] = (8, 48)
    """Output lengths, uniform in [lo, hi] (EOS ignored)."""
    seed: int = 0
    loads: tuple[Load, ...] = (Load("light", 0.25, 30), Load("medium", 0.5, 50), Load("heavy", 0.65, 65),
                               Load("saturated", 1.8, 90))
    """Fixed rates. light/medium/heavy were sized on a loaded machine (heavy then ran at
    ~90% utilisation); on a quiet one heavy neither migrates nor preempts, and
    ``saturated`` (about 90% of a quiet machine's capacity for this trace) is the
    near-saturation point."""
    systems: tuple[str, ...] = ("infaas++", "llumnix")

    def scheduling(self, system: str) -> dict[str, Any]:
        """The SchedulingConfig dict of a system, the same on both sides."""
        return {"dispatch": {"policy": system},
                "rescheduling": {"enabled": system == "llumnix", "out_threshold": self.migrate_out_threshold,
                                 "in_threshold": self.migrate_out_threshold}}


# -- the trace ----------------------------------------------------------------------------
def make_trace(setup: FidelitySetup, load: Load) -> Any:
    from llumnix.sim.workloads import Trace

    rng = np.random.default_rng([setup.seed, int(load.rate * 1000), load.num_requests])
    gaps = rng.exponential(1.0 / load.rate, load.num_requests)
    gaps[0] = 0.5
    prompts = rng.integers(setup.prompt_tokens[0], setup.prompt_tokens[1] + 1, load.num_requests)
    outputs = rng.integers(setup.output_tokens[0], setup.output_tokens[1] + 1, load.num_requests)
    return Trace(load.name, load.rate, setup.seed, np.cumsum(gaps), prompts, outputs,
                 np.zeros(load.num_requests, dtype=np.int64))


def prompt_ids(i: int, n: int, vocab: int) -> list[int]:
    """Prompt ``i`` of ``n`` token ids: ordinary vocabulary, no two alike."""
    lo = min(100, vocab // 4)
    return [lo + (j * 7919 + (i + 1) * 104729) % max(1, vocab - lo) for j in range(n)]


# -- the simulator side --------------------------------------------------------------------
def scaled(model: Any, factor: float) -> Any:
    """A profile's step latencies times ``factor`` (CPU contention measured elsewhere)."""
    if factor == 1.0:
        return model
    return dataclasses.replace(model, prefill_s=tuple(factor * t for t in model.prefill_s),
                               decode_s=tuple(tuple(factor * t for t in row) for row in model.decode_s))


class _Recorder:
    """A latency model that remembers every step it priced: (requests in the step, the
    model's seconds: without the serving overhead between steps and before the executor's
    neighbor factor, as the real step logs time ``EngineCore.step`` alone)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.migration = inner.migration
        self.contention = inner.contention
        self.step_overhead_s = inner.step_overhead_s
        self.seq_overhead_s = inner.seq_overhead_s
        self.steps: list[tuple[int, float]] = []

    def prefill_time(self, seq_lens: Any) -> float:
        t = float(self.inner.prefill_time(seq_lens))
        self.steps.append((len(seq_lens), t))
        return t

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float:
        t = float(self.inner.decode_time(batch_size, num_context_tokens))
        self.steps.append((batch_size, t))
        return t


def run_sim(setup: FidelitySetup, system: str, trace: Any, profile: str, scale: float = 1.0,
            step_gap_s: float = 0.0, neighbor_decode: float | None = None,
            cluster_prefill: tuple[float, float] | None = None) -> dict[str, Any]:
    """The trace in the simulator with the profile (times ``scale``); ``step_gap_s`` is
    added to every step: the instance's serving loop between two engine steps (status
    push, output hand-off), which the profile's bare ``EngineCore.step()`` loop does
    not have (``step_gap``). ``neighbor_decode`` replaces the profile's decode neighbor
    factor (one measured on the cluster, ``_probe_neighbor``); ``cluster_prefill`` =
    (speed, neighbor factor) replaces the profile's prefill by the cluster's
    (``_probe_prefill``): prefill steps times ``speed``, and its neighbor factor."""
    from llumnix.migration.protocol import MigrationConfig
    from llumnix.policy import SchedulingConfig
    from llumnix.sim.cluster import ClusterConfig
    from llumnix.sim.latency import get_latency_model
    from llumnix.sim.policy_bridge import PolicyBridge
    from llumnix.sim.simulator import Simulator

    every = max(1, round(setup.reschedule_interval_s / setup.status_interval_s))
    cfg = ClusterConfig(num_instances=setup.num_instances, num_blocks=setup.num_blocks,
                        block_size=setup.block_size, max_num_seqs=setup.max_num_seqs,
                        max_num_batched_tokens=setup.max_num_batched_tokens, max_model_len=8192,
                        watermark=setup.watermark, status_interval_s=setup.status_interval_s,
                        reschedule_every=every, migration=MigrationConfig())
    sched = setup.scheduling(system)
    sched["dispatch"]["pending_grace_s"] = 0.0  # a simulated add is seen at once
    policy = PolicyBridge(SchedulingConfig.from_dict(sched), seed=setup.seed,
                          scaling_interval_s=setup.status_interval_s)
    model = scaled(get_latency_model(profile), scale)
    if neighbor_decode is not None:
        model = dataclasses.replace(model, contention=dataclasses.replace(model.contention, decode=neighbor_decode))
    if cluster_prefill is not None:
        speed, factor = cluster_prefill
        model = dataclasses.replace(model, prefill_s=tuple(speed * t for t in model.prefill_s),
                                    contention=dataclasses.replace(model.contention, prefill=factor))
    latency = _Recorder(dataclasses.replace(model, step_overhead_s=step_gap_s))
    sim = Simulator(cfg, latency, policy, trace)
    summary = sim.run()
    arr = sim.metrics.request_arrays()
    by: dict[int, list[float]] = {}
    for n, t in latency.steps:
        by.setdefault(n, []).append(t)
    steps = {"num_steps": len(latency.steps), "busy_s": sum(t for _, t in latency.steps),
             "mean_s_by_batch": {str(n): statistics.fmean(v) for n, v in sorted(by.items())},
             "count_by_batch": {str(n): len(v) for n, v in sorted(by.items())}}
    return {"ttft": arr["prefill"].tolist(), "decode": arr["decode"].tolist(), "e2e": arr["e2e"].tolist(),
            "scale": scale, "step_gap_s": step_gap_s, "neighbor_decode": neighbor_decode,
            "cluster_prefill": list(cluster_prefill) if cluster_prefill else None, "steps": steps,
            "num_migrations": int(summary["migrations"]["num_committed"]),
            "num_migrations_aborted": int(summary["migrations"]["num_aborted"]),
            "num_preemptions": int(summary["num_preemptions"])}


# -- the real side -------------------------------------------------------------------------
@dataclass
class _Rec:
    sent: float = 0.0
    request_id: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    num_output_tokens: int = 0
    error: str | None = None


async def _one(client: Any, url: str, body: dict[str, Any]) -> _Rec:
    t0 = time.monotonic()
    rec = _Rec(sent=t0)
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}"
                return rec
            async for chunk in sse_chunks(r):
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                rec.request_id = chunk.get("id", rec.request_id)
                if chunk.get("usage"):
                    rec.num_output_tokens = int(chunk["usage"]["completion_tokens"])
                if chunk.get("choices") and rec.ttft is None:
                    rec.ttft = time.monotonic() - t0
        rec.e2e = time.monotonic() - t0
    except Exception as e:  # noqa: BLE001 - counted as this request's error
        rec.error = f"{type(e).__name__}: {e}"[:200]
    return rec


async def _drive(url: str, model: str, trace: Any, vocab: int) -> list[_Rec]:
    import httpx

    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.monotonic()

        async def fire(i: int) -> _Rec:
            await asyncio.sleep(max(0.0, float(trace.arrival_times[i]) - (time.monotonic() - t0)))
            body = {"model": model, "prompt": prompt_ids(i, int(trace.prompt_lens[i]), vocab),
                    "max_tokens": int(trace.output_lens[i]), "ignore_eos": True, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}
            return await _one(client, url, body)

        return list(await asyncio.gather(*(fire(i) for i in range(len(trace)))))


def _probe_overhead(url: str, model: str, instances: dict[str, Any], vocab: int, n: int = 6) -> dict[str, Any]:
    """Serving-path latency of single requests on the idle cluster: client TTFT minus the
    duration of the engine step that produced the token (found in the step log)."""
    import httpx
    import ray

    added: list[float] = []
    with httpx.Client(timeout=120) as c:
        for k in range(n + 1):
            body = {"model": model, "prompt": prompt_ids(10_000 + k, 32, vocab), "max_tokens": 1,
                    "ignore_eos": True, "temperature": 0}
            t0 = time.monotonic()
            c.post(f"{url}/v1/completions", json=body).raise_for_status()
            total = time.monotonic() - t0
            steps = [s for log in ray.get([a.step_log.remote() for a in instances.values()], timeout=30)
                     for s in log if s[0] >= t0 and s[1] <= t0 + total]
            if k and steps:  # the first warms the path up
                start, end, _ = min(steps)
                added.append(total - (end - start))
            time.sleep(0.2)
    if not added:
        raise LlumnixError("fidelity: no probe request was found in the instances' step logs")
    return {"samples_s": added, "median_s": statistics.median(added)}


def _post_all(client: Any, url: str, bodies: list[dict[str, Any]]) -> None:
    """Send the completion requests at once and wait for all of them."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(bodies)) as pool:
        list(pool.map(lambda b: client.post(f"{url}/v1/completions", json=b).raise_for_status(), bodies))


def _step_window(instances: dict[str, Any], t0: float, t1: float,
                 prefill_flag: bool = False) -> list[list[tuple[float, ...]]]:
    """Each instance's steps that ran within [t0, t1], times relative to t0: (start, end,
    batch size), with ``prefill_flag`` also 1 for a prefill step and 0 for a decode step."""
    import ray

    logs = ray.get([a.step_log.remote(cpu=prefill_flag) for a in instances.values()], timeout=30)
    return [[(round(s[0] - t0, 4), round(s[1] - t0, 4), s[2], *((int(s[4]),) if prefill_flag else ()))
             for s in log if s[0] >= t0 and s[1] <= t1] for log in logs]


def _probe_steps(url: str, model: str, instances: dict[str, Any], vocab: int,
                 per_instance: tuple[int, ...] = (1, 2, 4), max_tokens: int = 12) -> dict[str, Any]:
    """Decode step times of the live cluster before the trace: for each n, n requests per
    instance at once (the dispatcher spreads them), and the median duration of the steps
    that produced n tokens. The simulator can scale its profile by the ratio to what the
    profile predicts for the same steps: contention measured without the trace."""
    import httpx

    out: dict[str, Any] = {}
    with httpx.Client(timeout=300) as c:
        for n in per_instance:
            t0 = time.monotonic()
            _post_all(c, url, [{"model": model, "prompt": prompt_ids(20_000 + 100 * n + i, 32, vocab),
                                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
                               for i in range(n * len(instances))])
            t1 = time.monotonic()
            window = _step_window(instances, t0, t1)
            steps = [e - s for log in window for s, e, m in log if m == n]
            # Each decode step of n requests holds n * (32 + i) context tokens at output i.
            out[str(n)] = {"median_s": statistics.median(steps) if steps else None, "num_steps": len(steps),
                           "context_tokens": n * (32 + max_tokens // 2), "wall_s": t1 - t0,
                           "log": window}
            time.sleep(0.2)
    return out


def _probe_neighbor(url: str, model: str, instances: dict[str, Any], vocab: int, rounds: int = 3,
                    max_tokens: int = 16) -> dict[str, Any]:
    """The neighbor effect on the live cluster before the trace: one request alone (one
    instance decodes, the other is idle) and two at once (the dispatcher puts one on each,
    both decode), in turn for ``rounds`` rounds, alternating which goes first. The steps
    of the whole probe, split by overlap (``neighbor_effect``), give the decode slowdown
    beside a stepping neighbor as the cluster has it, with its serving processes."""
    import httpx

    t0 = time.monotonic()
    k = 0
    with httpx.Client(timeout=300) as c:
        for r in range(rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                _post_all(c, url, [{"model": model, "prompt": prompt_ids(30_000 + k + i, 32, vocab),
                                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
                                   for i in range(1, n + 1)])
                k += n
                time.sleep(0.1)
    t1 = time.monotonic()
    window = _step_window(instances, t0, t1)
    effect = neighbor_effect(window) if len(window) == 2 else {"ratio_by_batch": {}}
    return {"ratio": effect["ratio_by_batch"].get("1"), "effect": effect, "log": window, "wall_s": t1 - t0}


def _probe_prefill(url: str, model: str, instances: dict[str, Any], vocab: int, rounds: int = 4,
                   prompt_tokens: int = 32, hold_tokens: int = 40) -> dict[str, Any]:
    """Prefill steps on the live cluster before the trace: a one-token request alone (both
    instances idle) and one sent while another request decodes (``hold_tokens`` long;
    the dispatcher puts the short one on the idle instance), in turn for ``rounds``
    rounds, alternating which goes first. ``prefill_split`` gives the median prefill
    step alone and beside a decoding neighbor: the cluster's prefill speed against the
    profile's, and its prefill neighbor factor, with the serving processes in both (the
    bare engines' profile measures x1.09; the cluster's prefill steps ran 1.17-1.48x the
    profile under load in round 3)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def body(k: int, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "prompt": prompt_ids(40_000 + k, prompt_tokens, vocab), "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}

    t0 = time.monotonic()
    k = 0
    with httpx.Client(timeout=300) as c, ThreadPoolExecutor(1) as background:
        for r in range(rounds):
            for beside in ((False, True) if r % 2 == 0 else (True, False)):
                hold = None
                if beside:
                    hold = background.submit(lambda b: c.post(f"{url}/v1/completions", json=b).raise_for_status(),
                                             body(k, hold_tokens))
                    k += 1
                    time.sleep(0.5)  # its prefill is over: it decodes
                c.post(f"{url}/v1/completions", json=body(k, 1)).raise_for_status()
                k += 1
                if hold is not None:
                    hold.result()
                time.sleep(0.1)
    t1 = time.monotonic()
    window = _step_window(instances, t0, t1, prefill_flag=True)
    split = prefill_split(window) if len(window) == 2 else {"alone": [], "busy": []}
    return {"prompt_tokens": prompt_tokens, **split, "log": window, "wall_s": t1 - t0}


def prefill_split(logs: list[list[tuple[float, ...]]]) -> dict[str, Any]:
    """One-request prefill steps of two instances (logs with a prefill flag) split by what
    the other instance did meanwhile: ``alone`` (stepping under 10% of the time) or
    ``busy`` (over 90%); durations in seconds, and the medians and their ratio where each
    side has 2 or more."""
    out: dict[str, Any] = {"alone": [], "busy": []}
    for i in (0, 1):
        other = sorted(logs[1 - i])
        starts = [o[0] for o in other]
        for step in logs[i]:
            if not step[3] or step[2] != 1:
                continue
            f = overlap_fraction(step, other, starts)
            side = "alone" if f < 0.1 else "busy" if f > 0.9 else None
            if side:
                out[side].append(step[1] - step[0])
    for side in ("alone", "busy"):
        out[f"{side}_median_s"] = statistics.median(out[side]) if len(out[side]) >= 2 else None
    a, b = out["alone_median_s"], out["busy_median_s"]
    out["ratio"] = b / a if a and b else None
    return out


def cluster_prefill(probe: dict[str, Any], model: Any) -> tuple[float, float] | None:
    """(prefill speed of the cluster alone / the profile's, prefill neighbor factor) from
    a ``_probe_prefill``; None where the probe lacks either side."""
    if not probe or not probe.get("ratio") or not probe.get("alone_median_s"):
        return None
    return probe["alone_median_s"] / model.prefill_time([int(probe["prompt_tokens"])]), float(probe["ratio"])


def step_gap(probe: dict[str, Any]) -> float | None:
    """Median time between back-to-back steps of one instance in the step probe (taken
    on the idle cluster before the trace): the serving loop's own work per step. Gaps
    of 50 ms or more are idle time, not loop work."""
    gaps = [b[0] - a[1] for p in probe.values() for log in p.get("log", [])
            for a, b in zip(log, log[1:], strict=False) if 0 <= b[0] - a[1] < 0.05]
    return statistics.median(gaps) if gaps else None


def contention_scale(probe: dict[str, Any], model: Any) -> float | None:
    """Geometric mean over the probe's points of measured / profiled decode step time.
    Both instances step at once in the probe, so the profiled time includes the model's
    neighbor factor for decode (1 when it has none)."""
    ratios = [p["median_s"] / (model.contention.decode * model.decode_time(int(n), int(p["context_tokens"])))
              for n, p in probe.items() if p.get("median_s")]
    if not ratios:
        return None
    return float(np.exp(np.mean(np.log(ratios))))


class _Gateway(InProcessGateway):
    """The OpenAI gateway over ``cluster`` in a thread (as `llumnix serve` runs it), with a
    backend that keeps each request's engine-side timing (the metrics on its last output)."""

    def __init__(self, cluster: Any, tokenizer: Any) -> None:
        from llumnix.cluster.backend import ClusterBackend

        engine_metrics: dict[str, Any] = {}

        class TracingBackend(ClusterBackend):
            async def generate(self, request: Any) -> Any:
                async for out in super().generate(request):
                    if out.metrics is not None:
                        engine_metrics[request.request_id] = out.metrics
                    yield out

        self.engine_metrics = engine_metrics
        super().__init__(TracingBackend(cluster.llumsched, cluster.instances, cluster.info, tokenizer))


def ttft_breakdown(recs: list[_Rec], engine_metrics: dict[str, Any]) -> dict[str, Any]:
    """Where real TTFT goes, per request (monotonic clock, shared by client and engines):
    send -> added to an engine (dispatch path) -> first scheduled (queue) -> first token
    (prefill step) -> first chunk at the client (hand-off and stream)."""
    parts: dict[str, list[float]] = {"dispatch_s": [], "queue_s": [], "prefill_s": [], "delivery_s": [],
                                     "index": []}
    for i, r in enumerate(recs):
        m = engine_metrics.get(r.request_id or "")
        if m is None or r.ttft is None or m.first_scheduled_time is None or m.first_token_time is None:
            continue
        parts["index"].append(i)
        parts["dispatch_s"].append(m.arrival_time - r.sent)
        parts["queue_s"].append(m.first_scheduled_time - m.arrival_time)
        parts["prefill_s"].append(m.first_token_time - m.first_scheduled_time)
        parts["delivery_s"].append(r.sent + r.ttft - m.first_token_time)
    return {k: {"mean": statistics.fmean(v), "p99": _pct(v, 99), "values": v} if v else None
            for k, v in parts.items()}


def prefill_scale(real: dict[str, Any], trace: Any, model: Any) -> float | None:
    """How much slower the run's prefill steps were than the profile's, like for like: the
    median over requests of the measured first-prefill step (engine timing) over the
    profile's prefill of that prompt. Only prefill steps, whose cost the load does not
    change (a decode step's does: a slower machine holds more requests per batch)."""
    b = real.get("ttft_breakdown") or {}
    if not b.get("prefill_s"):
        return None
    values = b["prefill_s"]["values"]
    index = (b.get("index") or {}).get("values") or list(range(len(values)))
    if len(index) != len(values):
        return None
    ratios = [v / model.prefill_time([int(trace.prompt_lens[i])]) for i, v in zip(index, values, strict=True)]
    return float(statistics.median(ratios))


def run_real(setup: FidelitySetup, system: str, trace: Any) -> dict[str, Any]:
    import ray

    from llumnix.cluster.launcher import ClusterConfig, start_cluster
    from llumnix.model import load_model

    engine = {"num_blocks": setup.num_blocks, "block_size": setup.block_size,
              "max_num_seqs": setup.max_num_seqs, "max_num_batched_tokens": setup.max_num_batched_tokens}
    cfg = ClusterConfig(model=setup.model, instances=setup.num_instances, engine=engine,
                        scheduling=setup.scheduling(system), threads_per_instance=setup.threads_per_instance,
                        reschedule_interval_s=setup.reschedule_interval_s,
                        namespace=f"fidelity-{time.time_ns()}")
    loaded = load_model(setup.model)
    vocab = loaded.config.vocab_size
    cluster = start_cluster(cfg)
    try:
        gateway = _Gateway(cluster, loaded.tokenizer)
        with gateway as url:
            import httpx

            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            overhead = _probe_overhead(url, model, cluster.instances, vocab)
            probe = _probe_steps(url, model, cluster.instances, vocab)
            neighbor = _probe_neighbor(url, model, cluster.instances, vocab)
            prefill_probe = _probe_prefill(url, model, cluster.instances, vocab)
            base = [s.num_preemptions for s in ray.get([a.status.remote() for a in cluster.instances.values()])]
            t0 = time.monotonic()
            recs = asyncio.run(_drive(url, model, trace, vocab))
            duration = time.monotonic() - t0
            info = ray.get(cluster.llumsched.cluster_info.remote(), timeout=30)
            statuses = ray.get([a.status.remote() for a in cluster.instances.values()], timeout=30)
            logs = ray.get([a.step_log.remote(cpu=True) for a in cluster.instances.values()], timeout=30)
            gw = httpx.get(f"{url}/admin/cluster", timeout=30).json().get("gateway", {})
    finally:
        cluster.shutdown()
    ok = [r for r in recs if r.error is None and r.ttft is not None and r.e2e is not None]
    decode = [(r.e2e - r.ttft) / (r.num_output_tokens - 1) for r in ok
              if r.e2e is not None and r.ttft is not None and r.num_output_tokens > 1]
    return {"ttft": [r.ttft for r in ok], "decode": decode, "e2e": [r.e2e for r in ok],
            "num_errors": len(recs) - len(ok), "errors": sorted({r.error for r in recs if r.error})[:3],
            "num_migrations": int(info["migrations"]["committed"]),
            "num_migrations_aborted": int(info["migrations"]["aborted"]),
            "num_preemptions": int(sum(s.num_preemptions for s in statuses) - sum(base)),
            "serving_overhead": overhead, "step_probe": probe, "neighbor_probe": neighbor,
            "prefill_probe": prefill_probe,
            "duration_s": duration, "gateway": gw,
            "ttft_breakdown": ttft_breakdown(recs, gateway.engine_metrics),
            "loadavg_after": list(os.getloadavg()),
            "steps": step_stats([[s for s in log if s[0] >= t0] for log in logs]),
            "step_logs": [[(round(s - t0, 4), round(e - t0, 4), n, round(c, 4), int(pf))
                           for s, e, n, c, pf in log if s >= t0] for log in logs],
            "arrival_s": [float(trace.arrival_times[i]) for i, r in enumerate(recs) if any(r is o for o in ok)]}


def step_stats(logs: list[list[tuple[float, ...]]]) -> dict[str, Any]:
    """Per instance step logs -> mean real step time by the number of requests the step
    produced tokens for, and the time between back-to-back steps (the serving loop's own
    work: status reports, output hand-off, commands; gaps over 50 ms are idle time).
    Where the log has the step thread's CPU seconds, also the wall / CPU ratio by batch:
    above 1, the step waited (for the GIL or a core) rather than computed; where it marks
    prefill steps, also the mean of the decode steps alone by batch."""
    by: dict[int, list[float]] = {}
    cpu: dict[int, list[float]] = {}
    decode: dict[int, list[float]] = {}
    gaps: list[float] = []
    busy = 0.0
    for log in logs:
        for prev, step in zip(log, log[1:], strict=False):
            if step[0] - prev[1] < 0.05:
                gaps.append(step[0] - prev[1])
        for start, end, n, *rest in log:
            by.setdefault(int(n), []).append(end - start)
            if rest:
                cpu.setdefault(int(n), []).append(rest[0])
            if len(rest) > 1 and not rest[1]:
                decode.setdefault(int(n), []).append(end - start)
            busy += end - start
    out = {"num_steps": sum(len(v) for v in by.values()), "busy_s": busy,
           "mean_gap_s": statistics.fmean(gaps) if gaps else None,
           "mean_s_by_batch": {str(n): statistics.fmean(v) for n, v in sorted(by.items())},
           "count_by_batch": {str(n): len(v) for n, v in sorted(by.items())}}
    if decode:
        out["decode_mean_s_by_batch"] = {str(n): statistics.fmean(v) for n, v in sorted(decode.items())}
    if cpu:
        out["wall_over_cpu_by_batch"] = {str(n): sum(by[n]) / sum(c) for n, c in sorted(cpu.items()) if sum(c) > 0}
    if len(logs) == 2:
        out["neighbor"] = neighbor_effect(logs)
    return out


def overlap_fraction(step: tuple[float, ...], other: list[tuple[float, ...]], starts: list[float]) -> float:
    """Fraction of ``step``'s wall time during which a step of ``other`` (sorted by start,
    ``starts`` its start times) was running."""
    s, e = step[0], step[1]
    if e <= s:
        return 0.0
    covered = 0.0
    # Steps of one instance do not overlap each other: start from the last one that began before s.
    for o in other[max(0, bisect.bisect_right(starts, s) - 1):]:
        if o[0] >= e:
            break
        covered += max(0.0, min(e, o[1]) - max(s, o[0]))
    return covered / (e - s)


def neighbor_effect(logs: list[list[tuple[float, ...]]], short_s: float = 0.15) -> dict[str, Any]:
    """Real steps of two instances split by what the other instance was doing meanwhile:
    ``alone`` (the other stepped under 10% of the step's time) and ``busy`` (over 90%),
    median wall seconds by batch size, and their ratio where both have 5+ steps. Steps
    longer than ``short_s`` (prefills at these prompt lengths) are left out, so the
    ratio is the decode steps' slowdown from a busy neighbor, what a latency profile's
    ``contention.neighbor_factor.decode`` models."""
    split: dict[str, dict[int, list[float]]] = {"alone": {}, "busy": {}}
    for i in (0, 1):
        other = sorted(logs[1 - i])
        starts = [o[0] for o in other]
        for step in logs[i]:
            dur = step[1] - step[0]
            if dur > short_s:
                continue
            f = overlap_fraction(step, other, starts)
            side = "alone" if f < 0.1 else "busy" if f > 0.9 else None
            if side:
                split[side].setdefault(int(step[2]), []).append(dur)
    out: dict[str, Any] = {k: {str(n): {"median_s": statistics.median(v), "count": len(v)}
                               for n, v in sorted(d.items())} for k, d in split.items()}
    out["ratio_by_batch"] = {str(n): statistics.median(split["busy"][n]) / statistics.median(a)
                             for n, a in sorted(split["alone"].items())
                             if len(a) >= 5 and len(split["busy"].get(n, [])) >= 5}
    return out


# -- comparison ---------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def metrics_of(samples: dict[str, Any], offset_s: float = 0.0) -> dict[str, float]:
    """The compared metrics of one side; ``offset_s`` is added to TTFT and end-to-end."""
    ttft = [t + offset_s for t in samples["ttft"]]
    e2e = [t + offset_s for t in samples["e2e"]]
    dec = list(samples["decode"])
    return {"ttft_mean": float(np.mean(ttft)) if ttft else float("nan"), "ttft_p99": _pct(ttft, 99),
            "decode_mean": float(np.mean(dec)) if dec else float("nan"), "decode_p99": _pct(dec, 99),
            "e2e_mean": float(np.mean(e2e)) if e2e else float("nan"), "e2e_p99": _pct(e2e, 99),
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


# -- output -------------------------------------------------------------------------------
def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'load':<6} {'system':<9} {'metric':<16} {'sim':>9} {'real':>9} {'error':>8}"]
    for load, rows in report["table"].items():
        for system, row in rows.items():
            for m in METRICS:
                c = row[m]
                err = "-" if c["rel_error"] is None else f"{100 * c['rel_error']:+.1f}%"
                scale = 1.0 if m.startswith("num_") else 1000.0
                unit = "" if m.startswith("num_") else " ms"
                lines.append(f"{load:<6} {system:<9} {m + unit:<16} {scale * c['sim']:>9.1f} "
                             f"{scale * c['real']:>9.1f} {err:>8}")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Any]], png: Path, order: list[str], sim_key: str = "sim_in_run") -> None:
    """CDFs of TTFT and end-to-end latency, real (solid) against simulated (dashed), per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = {k.split("/")[0] for k in runs}
    loads = [ld for ld in order if ld in present]
    fig, axes = plt.subplots(len(loads), 2, figsize=(10, 3.6 * len(loads)), squeeze=False)
    colors = {"infaas++": "#4c72b0", "llumnix": "#dd8452"}
    for row, load in enumerate(loads):
        for col, metric in enumerate(("ttft", "e2e")):
            ax = axes[row][col]
            for key, run in sorted(runs.items()):
                sim_run = run.get(sim_key) or run.get("sim")
                if not key.startswith(load + "/") or not run.get("real_runs") or not sim_run:
                    continue
                system = key.split("/", 1)[1]
                reals = [run["real_runs"][i] for i in sim_run.get("real_runs", range(len(run["real_runs"])))]
                offset = statistics.median(r["serving_overhead"]["median_s"] for r in reals)
                real = np.sort(pool_real(reals)[metric])
                sim = np.sort(np.asarray(sim_run[metric]) + offset)
                c = colors.get(system)
                ax.plot(real, np.linspace(0, 1, len(real)), color=c, label=f"{system} real")
                ax.plot(sim, np.linspace(0, 1, len(sim)), color=c, ls="--", label=f"{system} sim")
            ax.set_xlabel(f"{'TTFT' if metric == 'ttft' else 'end-to-end latency'} (s)")
            ax.set_ylabel("CDF")
            ax.set_title(f"{load} load: {'TTFT' if metric == 'ttft' else 'end-to-end'}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("llumnix bench fidelity: real 2-instance cluster (solid) vs simulator (dashed),\n"
                 "the profile scaled to each run's prefill speed; each real run against its own simulation",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


@dataclass
class _Doc:
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)


def main_fidelity(args: argparse.Namespace) -> int:
    from llumnix.bench.machine import machine_info

    setup = FidelitySetup(model=args.model)
    profile = args.profile
    if not Path(profile).is_file():
        raise LlumnixError(f"profile {profile!r} not found: run `llumnix profile --out {profile}` first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fidelity.json"
    doc = _Doc(json.loads(path.read_text()).get("runs", {}) if path.exists() else {})
    loads = [ld for ld in setup.loads if not args.loads or ld.name in args.loads.split(",")]
    systems = [s for s in setup.systems if not args.systems or s in args.systems.split(",")]
    for flag, asked, known in (("--loads", args.loads, [ld.name for ld in setup.loads]),
                               ("--systems", args.systems, list(setup.systems))):
        unknown = [x for x in (asked or "").split(",") if asked and x not in known]
        if unknown:
            raise LlumnixError(f"{flag}: unknown {unknown[0]!r} (known: {', '.join(known)})")
    from llumnix.sim.latency import get_latency_model

    model = get_latency_model(profile)
    try:
        for load in loads:
            trace = make_trace(setup, load)
            for system in systems:
                key = f"{load.name}/{system}"
                run = doc.runs.setdefault(key, {"real_runs": []})
                if not args.sim_only:
                    print(f"fidelity {key}: real cluster, {len(trace)} requests at {load.rate} req/s ...",
                          flush=True)
                    run["real_runs"].append(run_real(setup, system, trace))
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
                for key, field, values in (
                        ("sim_scaled", "scales", {i: {"scale": f} for i, f in probe.items()}),
                        ("sim_in_run", "scales", {i: {"scale": f} for i, f in prefill.items()}),
                        ("sim_neighbor", "neighbor_decode", {i: {"neighbor_decode": f} for i, f in measured.items()}),
                        ("sim_cluster", "cluster_factors", both)):
                    if values:
                        sims = [run_sim(setup, system, trace, profile, step_gap_s=gap, **kw) for kw in values.values()]
                        params = [next(iter(kw.values())) if len(kw) == 1 else kw for kw in values.values()]
                        run[key] = {**pool_real(sims), field: params, "real_runs": list(values)}
                _write(path, doc, setup, profile, machine_info)
    finally:
        if not args.sim_only:
            import ray

            if ray.is_initialized():
                ray.shutdown()
    reports = _write(path, doc, setup, profile, machine_info)
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
    print(f"wrote {path} and {out / 'fidelity.png'}")
    return 0


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


def _write(path: Path, doc: _Doc, setup: FidelitySetup, profile: str, machine_info: Any) -> dict[str, Any]:
    reports = {name: build_report(doc.runs, setup, key) for name, key in SIM_VARIANTS.items()}
    data = {"setup": asdict(setup), "profile": profile, "reports": reports, "noise_floor": noise_floor(doc.runs),
            "runs": doc.runs,
            "machine": machine_info(with_torch=False)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return reports
