"""Run an experiment config: every (trace, rate, seed, system), then metrics.json and plots.

The same trace object (same seed) is replayed for every system, so systems are
compared on identical requests. Runs go to worker processes when ``jobs`` > 1.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llumnix.bench.machine import RESULTS_DIR
from llumnix.core.batch import RequestMetrics
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import ConfigError, ExperimentConfig, SystemSpec, load_config
from llumnix.sim.latency import get_latency_model
from llumnix.sim.metrics import SLO, SLOS
from llumnix.sim.workloads import TraceSpec, make_trace

if TYPE_CHECKING:
    from llumnix.sim.simulator import Simulator

KEEP_SAMPLES = ("prefill", "decode")
"""Per-request arrays kept (in memory) for the CDF plots."""


@dataclass(frozen=True)
class RunSpec:
    system: SystemSpec
    trace: TraceSpec
    rate: float
    seed: int
    cluster: ClusterConfig
    latency_model: str
    keep_samples: bool = False
    step_overhead_s: float | None = None
    """Replaces the latency model's serving overhead per step (None: the model's own)."""
    seq_overhead_s: float | None = None
    """Replaces the latency model's serving overhead per sequence per step (None: the model's own)."""
    slo: SLO | None = None
    """The objectives of the record's ``slo`` section (None: the latency model's ``SLOS`` entry)."""


def make_simulator(spec: RunSpec, progress: Callable[[int], None] | None = None) -> Simulator:
    """The simulation of one run, ready to ``run()`` (``live.py`` paces one it builds here)."""
    from llumnix.sim.policy_bridge import make_policy
    from llumnix.sim.simulator import Simulator

    trace = make_trace(spec.trace, spec.rate, spec.seed)
    model = get_latency_model(spec.latency_model)
    if spec.step_overhead_s is not None:
        model = dataclasses.replace(model, step_overhead_s=spec.step_overhead_s)  # type: ignore[type-var]
    if spec.seq_overhead_s is not None:
        model = dataclasses.replace(model, seq_overhead_s=spec.seq_overhead_s)  # type: ignore[type-var]
    policy = make_policy(spec.system, spec.cluster, seed=spec.seed)
    policy.seed_predictor(model)
    sim = Simulator(spec.cluster, model, policy, trace, progress=progress, priorities=spec.system.priorities)
    sim.metrics.slo = spec.slo or SLOS.get(spec.latency_model)
    sim.metrics.slo_classes = policy.config.slo
    return sim


def record_of(spec: RunSpec, num_requests: int, summary: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics record: what it was, and its simulator's summary."""
    return {"system": spec.system.name, "trace": spec.trace.name, "rate": spec.rate, "seed": spec.seed,
            "num_requests": num_requests, "num_instances": spec.cluster.num_instances, **summary}


def run_one(spec: RunSpec, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One simulation; returns its metrics record (plus ``_samples`` if asked)."""
    from llumnix.sim.policy_bridge import PolicyBridge

    sim = make_simulator(spec, progress)
    summary = sim.run()
    if isinstance(sim.policy, PolicyBridge) and sim.policy.gs.slo is not None:  # the slo policy's predictor
        slo = sim.policy.gs.slo
        summary["slo_predictor"] = {**ttft_errors(slo.ttft_log, sim.metrics.requests, sim.metrics.request_ids),
                                    **step_errors((p, s.seconds) for p, s, _ in slo.step_log)}
    record = record_of(spec, len(sim.trace), summary)
    if spec.keep_samples:
        arrays = sim.metrics.request_arrays()
        record["_samples"] = {k: arrays[k].tolist() for k in KEEP_SAMPLES}
    return record


def step_errors(pairs: Iterable[tuple[float, float]]) -> dict[str, float]:
    """The step-time model's (predicted, measured) step times: relative error P50 and P90."""
    a = np.asarray([abs(p / m - 1) for p, m in pairs if m > 0])
    if not len(a):
        return {"num_steps": 0}
    return {"num_steps": len(a), "step_rel_error_p50": float(np.percentile(a, 50)),
            "step_rel_error_p90": float(np.percentile(a, 90))}


def ttft_errors(predicted: Mapping[str, tuple[float, float]], requests: list[RequestMetrics],
                request_ids: list[str]) -> dict[str, float]:
    """The slo policy's TTFT predictions (per request id: arrival time, predicted TTFT) against
    the TTFTs the run measured (``requests``, whose ids are ``request_ids``): relative error P50
    and P90, and the signed median (> 0: predicted late). Matched by id: in goal.yaml's Gamma
    CV 4 traces a quarter of the requests share their arrival time with another, and matched
    by it, as first written, they were compared with another's TTFT."""
    actual = {i: r.ttft for i, r in zip(request_ids, requests, strict=True) if r.ttft}
    rel = [(p - actual[i]) / actual[i] for i, (_, p) in predicted.items() if i in actual]
    if not rel:
        return {"num": 0}
    a = np.abs(np.asarray(rel))
    return {"num": len(rel), "ttft_rel_error_p50": float(np.percentile(a, 50)),
            "ttft_rel_error_p90": float(np.percentile(a, 90)), "ttft_signed_p50": float(np.median(rel))}


def plan(cfg: ExperimentConfig, seeds: int | None = None) -> list[RunSpec]:
    runs = []
    for t in cfg.traces:
        top = max(t.rates)
        for rate in t.rates:
            for seed in range(seeds or t.seeds or cfg.seeds):
                for system in cfg.systems:
                    s = cfg.system_for(system, t)
                    runs.append(RunSpec(s, t.spec, rate, seed, cfg.cluster_for(s),
                                        cfg.latency_model, keep_samples=(rate == top and seed == 0),
                                        step_overhead_s=cfg.step_overhead_s,
                                        seq_overhead_s=cfg.seq_overhead_s, slo=cfg.slo))
    return runs


def _write(out: Path, cfg: ExperimentConfig, records: list[dict[str, Any]]) -> None:
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in records]
    order = {(t.spec.name): i for i, t in enumerate(cfg.traces)}
    sysorder = {s.name: i for i, s in enumerate(cfg.systems)}
    clean.sort(key=lambda r: (order.get(r["trace"], 0), r["rate"], r["seed"], sysorder.get(r["system"], 0)))
    from llumnix.bench.machine import machine_info

    doc = {"name": cfg.name, "latency_model": cfg.latency_model, "step_overhead_s": cfg.step_overhead_s,
           "seq_overhead_s": cfg.seq_overhead_s,
           "machine": machine_info(with_torch=False),
           "records": clean}
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    os.replace(tmp, out / "metrics.json")


def _key(system: str, trace: str, rate: float, seed: int) -> tuple[str, str, float, int]:
    return system, trace, float(rate), int(seed)


def done_records(out: Path, runs: list[RunSpec]) -> list[dict[str, Any]]:
    """Records already in ``out/metrics.json`` for runs of this plan (``--resume``)."""
    path = out / "metrics.json"
    if not path.is_file():
        return []
    try:
        old = json.loads(path.read_text())["records"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--resume: {path} is not a metrics file ({e})") from None
    wanted = {_key(r.system.name, r.trace.name, r.rate, r.seed) for r in runs}
    return [r for r in old if _key(r["system"], r["trace"], r["rate"], r["seed"]) in wanted]


def run_experiment(cfg: ExperimentConfig, out_dir: str | Path, seeds: int | None = None,
                   show_progress: bool = True, resume: bool = False) -> list[dict[str, Any]]:
    """Every run of the plan; with ``resume``, runs whose records are already in the
    output's metrics.json are kept, not rerun (same config and seed, same numbers)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(cfg, seeds)
    records: list[dict[str, Any]] = done_records(out, runs) if resume else []
    have = {_key(r["system"], r["trace"], r["rate"], r["seed"]) for r in records}
    runs = [r for r in runs if _key(r.system.name, r.trace.name, r.rate, r.seed) not in have]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not show_progress, transient=False) as bar:
        overall = bar.add_task(f"{cfg.name}: runs", total=len(runs))

        def label(r: RunSpec) -> str:
            return f"{r.trace.name} @ {r.rate:g} req/s, seed {r.seed}, {r.system.name}"

        if cfg.jobs == 1:
            for r in runs:
                task = bar.add_task(label(r), total=r.trace.num_requests)

                def advance(n: int, task: TaskID = task) -> None:
                    bar.advance(task, n)

                records.append(run_one(r, advance))
                bar.remove_task(task)
                bar.advance(overall)
                _write(out, cfg, records)
        else:
            with ProcessPoolExecutor(max_workers=cfg.jobs) as pool:
                futures = {pool.submit(run_one, r): r for r in runs}
                for fut in as_completed(futures):
                    records.append(fut.result())
                    bar.update(overall, advance=1, description=f"{cfg.name}: done {label(futures[fut])}")
                    _write(out, cfg, records)
    _write(out, cfg, records)
    if cfg.plots:
        from llumnix.sim.report import write_plots

        write_plots(records, out)
    return records


def main_simulate(config_path: str, overrides: list[str], seeds: int | None, out_dir: str | None,
                  resume: bool = False) -> int:
    """`llumnix simulate CONFIG.yaml [--set k=v ...] [--seeds N] [--out DIR] [--resume]`."""
    if seeds is not None and seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    cfg = load_config(config_path, overrides)
    out = Path(out_dir) if out_dir else Path(RESULTS_DIR) / "simulate" / cfg.name
    start = time.perf_counter()
    records = run_experiment(cfg, out, seeds, show_progress=sys.stderr.isatty(), resume=resume)
    wall = time.perf_counter() - start
    from llumnix.sim.report import summary_table

    print(summary_table(records))
    print(f"{len(records)} runs in {wall:.1f} s; results in {out}/metrics.json")
    return 0
