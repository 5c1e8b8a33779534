"""One run of the trace on the real cluster: 2 instance actors on Ray, LlumSched and
the OpenAI gateway in a thread, driven over HTTP with streamed completions."""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.fidelity.compare import percentile
from benchmarks.fidelity.probes import probe_neighbor, probe_overhead, probe_prefill, probe_steps
from benchmarks.fidelity.workload import FidelitySetup, prompt_ids

from llumnix.bench.serve_bench import sse_chunks
from llumnix.bench.step_log import step_stats
from llumnix.gateway.inprocess import InProcessGateway


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



class _Gateway(InProcessGateway):
    """The OpenAI gateway over ``cluster`` in a thread (as `llumnix serve` runs it), with a
    backend that keeps each request's engine-side timing (the metrics on its last output)."""

    def __init__(self, cluster: Any, tokenizer: Any) -> None:
        from llumnix.cluster.gateway_client import ClusterBackend

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
    return {k: {"mean": statistics.fmean(v), "p99": percentile(v, 99), "values": v} if v else None
            for k, v in parts.items()}



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
            overhead = probe_overhead(url, model, cluster.instances, vocab)
            probe = probe_steps(url, model, cluster.instances, vocab)
            neighbor = probe_neighbor(url, model, cluster.instances, vocab)
            prefill_probe = probe_prefill(url, model, cluster.instances, vocab)
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
                           for s, e, n, c, pf, *_ in log if s >= t0] for log in logs],
            "arrival_s": [float(trace.arrival_times[i]) for i, r in enumerate(recs) if any(r is o for o in ok)]}

