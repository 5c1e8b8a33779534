"""``bench cluster``'s capacity probe: the rate the cluster completes requests at with a
fixed number in flight (closed loop), and the sizing rule checked on the same window."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from llumnix.bench.serve_bench import PlannedRequest, run_load
from llumnix.core.errors import LlumnixError

if TYPE_CHECKING:
    import numpy as np

    from llumnix.bench.cluster_bench import ClusterBenchSettings
    from llumnix.bench.cluster_server import ServeProcess

KV_BINDS = 0.8
"""The sizing rule: KV, not compute, binds capacity. It holds when, over the capacity
probe's steady state (the window its rate is measured in), requests queue at the instances
(at least one an instance, on average) while fewer than ``max_num_seqs`` run, and at least
this fraction of the KV blocks is in use; the probe reports it (``kv_binds``). Not 90%: with
10 blocks an instance one block is 10% of it, and a preempted request at the head of the
queue waits for its whole sequence's blocks, so a KV-bound instance of this engine sits
at 80-100% from step to step (85-86% measured with 8 requests queued, 2026-11-26)."""



def probe_capacity(s: ClusterBenchSettings, server: ServeProcess, pairs: tuple[np.ndarray, np.ndarray],
                   vocab: int) -> dict[str, Any]:
    """Requests per second the cluster completes with ``probe_concurrency`` in flight (see
    the module's docstring for the rule), and the cluster over the same window: the sizing
    rule (``KV_BINDS``) is that KV binds there."""
    from llumnix.bench.cluster_bench import make_requests
    from llumnix.bench.cluster_server import poll_cluster

    reqs = make_requests(s, pairs, s.probe_requests, None, 1000, vocab, salt=7_000_000)
    done: list[float] = []
    samples: list[dict[str, Any]] = []

    async def closed_loop() -> None:
        sem = asyncio.Semaphore(s.probe_concurrency)
        stop = asyncio.Event()
        t0 = time.perf_counter()
        poller = asyncio.create_task(poll_cluster(server.url, 0.5, samples, stop, t0))

        async def one(r: PlannedRequest) -> None:
            async with sem:
                recs, _ = await run_load(server.url, server.model, [r], show_progress=False)
                if recs[0].error is None:
                    done.append(time.perf_counter() - t0)

        try:
            await asyncio.gather(*(one(r) for r in reqs))
        finally:
            stop.set()
            await poller

    asyncio.run(closed_loop())
    server.wait_idle()
    done.sort()
    c = s.probe_concurrency
    if len(done) < 2 * c + 2:
        raise LlumnixError(f"capacity probe: only {len(done)} of {len(reqs)} requests completed")
    rate = (len(done) - 2 * c - 1) / (done[-c - 1] - done[c])
    steady = steady_state(samples, done[c], done[-c - 1])
    kv = steady["kv_usage"]
    return {"capacity_req_s": rate, "num_completed": len(done), "makespan_s": done[-1],
            "kv_usage_steady": kv, "kv_binds": kv_binds(s, steady),
            "running_steady": steady["num_running"], "waiting_steady": steady["num_waiting"],
            "rule": f"closed loop, {c} in flight, {len(reqs)} requests; completions "
                    f"{c + 1}..{len(reqs) - c} per second"}


def kv_binds(s: ClusterBenchSettings, steady: dict[str, float | None]) -> bool:
    """The ``KV_BINDS`` rule on the probe's steady state."""
    kv, run, wait = steady["kv_usage"], steady["num_running"], steady["num_waiting"]
    return (kv is not None and run is not None and wait is not None and kv >= KV_BINDS
            and wait >= s.instances and run < s.instances * s.max_num_seqs)


def probe_line(capacity: dict[str, Any]) -> str:
    kv, run, wait = (capacity.get(k) for k in ("kv_usage_steady", "running_steady", "waiting_steady"))
    if kv is None or run is None or wait is None:
        return "no samples of the cluster"
    verdict = ": KV binds" if capacity["kv_binds"] else f": KV does not bind (KV_BINDS: {KV_BINDS:.0%}, queued)"
    return f"KV in use {kv:.0%}, {run:.1f} requests running and {wait:.1f} queued{verdict}"


def steady_state(samples: list[dict[str, Any]], start_s: float, end_s: float) -> dict[str, float | None]:
    """Over the samples in [start_s, end_s]: the mean fraction of the cluster's KV blocks
    in use, and the mean numbers of requests running and queued (cluster-wide)."""
    from llumnix.bench.cluster_report import kv_series

    window = [x for x in samples if start_s <= x["t"] <= end_s]
    kv = [u for _, u in kv_series(window)]

    def mean(key: str) -> float | None:
        vals = [sum(i.get(key) or 0 for i in x["instances"]) for x in window]
        return sum(vals) / len(vals) if vals else None

    return {"kv_usage": sum(kv) / len(kv) if kv else None, "num_running": mean("num_running"),
            "num_waiting": mean("num_waiting")}
