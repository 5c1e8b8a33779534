"""The trace in the simulator, on a measured latency profile, with the cluster's settings."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from benchmarks.fidelity.workload import FidelitySetup

from llumnix.migration.protocol import MigrationConfig
from llumnix.policy import SchedulingConfig
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import PolicyBridge
from llumnix.sim.simulator import Simulator


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
    factor (one measured on the cluster, ``probe_neighbor``); ``cluster_prefill`` =
    (speed, neighbor factor) replaces the profile's prefill by the cluster's
    (``probe_prefill``): prefill steps times ``speed``, and its neighbor factor."""
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

