"""Measure the real CPU cluster's information path for the simulator (issue 45): how old
LlumSched's statuses are when it reads them, and how long a migration order takes to
start its migration. Measured, never fitted to the outcomes the simulator predicts.

    python -m benchmarks.cluster.calibrate_info_path [--samples 6] [--compare] [--out F.json]

(About 20 s to start the cluster and 5-20 s a sample on a 2-core VM, by its load: 6 samples
stay under 3 minutes unless the machine is loaded; the committed run took 10 at load 14-23, 4 minutes.)

One local cluster of 2 SmolLM2 instances (CPU, serve's rescheduling defaults: pairing even,
min_tokens_left 4, the 0.5 s round and its status feed; KV room enough that LlumSched
orders nothing itself). Per sample, 3 long requests on one instance; once it decodes, the
script orders a migration to the other exactly as LlumSched's pass does
(``InstanceActor.migrate_out``), taking the order's instant on the host's monotonic clock,
the clock the source's migration report stamps its ``start_time`` with. Meanwhile it reads
LlumSched's view every ~20 ms (``cluster_info``: each status's ``age_s``, LlumSched's clock
less the instance's push).

Where the order's time goes (``where_it_goes``, issue 45): the migration report's marks cut
it into spans (``_breakdown``: the Ray call's way to the source actor, the destination's
status read, the source's step boundaries before the first stage, the first stage's
reservation, KV write and post-stage check), beside the source's step time meanwhile and
its wall over CPU time (the load). ``--compare`` alternates, two samples each, the
migration config's ``merge_boundaries`` on (the default) and off (the old way: the pick, the
start, the first stage's blocks, the check, the top-up and the pause each at a boundary of
its own), in one cluster; the simulator's figures come from the samples with it on.

What the simulator takes (``sim_vs_real --calibration``): ``ClusterConfig.migration_start_s``
= the median from the order to the first stage's begin (the report's ``first_stage``
mark; the committed 0.47 s of 2026-11-28 stopped at ``start_time``, a boundary earlier); ``ClusterConfig.status_delay_s`` = the median age
of a busy instance's status at LlumSched less half the simulator's report interval (0.05 s:
a simulated status is that old on average at a random read without any delay); the
migration cost's ``stage_overhead_s`` = the median of a committed migration's duration over
its stages (a few blocks: the copy is negligible, the stage's calls are not). Written with
the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

SIM_REPORT_S = 0.05
"""The simulator's status report interval (``sim_vs_real.BUSY_REPORT_S``)."""
ENGINE = {"device": "cpu", "num_blocks": 64, "block_size": 16, "max_num_seqs": 16}
REQUESTS_PER_SAMPLE = 3
PROMPT_TOKENS = 24
MAX_TOKENS = 48


def _info(cluster: Any) -> dict[str, Any]:
    import ray

    return dict(ray.get(cluster.llumsched.cluster_info.remote(), timeout=30))


def _poll(cluster: Any, ages: list[float], until: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """Read LlumSched's view every ~20 ms until ``until(info)``; the busy instances' status ages go to ``ages``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _info(cluster)
        ages.extend(s["age_s"] for s in info["instances"] if s["num_running"])
        if until(info):
            return info
        time.sleep(0.02)
    raise SystemExit("calibrate_info_path: the cluster did not reach the state it waited for; the run is void")


def _idle(info: dict[str, Any]) -> bool:
    return (all(s["num_running"] == 0 and s["num_waiting"] == 0 for s in info["instances"])
            and not info["migrations"]["in_flight"])


STEPS = ("dispatch", "dst_read", "boundary", "first_blocks", "first_reserve", "first_send", "first_check")
"""Where the time from the order to the first stage's end goes (``_breakdown``)."""


def _breakdown(t0: float, rep: dict[str, Any]) -> dict[str, float | None]:
    """The report's marks (the source's monotonic clock, this host's) as consecutive spans:
    ``dispatch`` the Ray call's way to the actor's thread (``order_received``); ``dst_read``
    the destination's status read over Ray; ``boundary`` from then to ``start_time``: the
    source's step boundaries that pick and start the request; ``first_blocks`` to the
    first stage's begin (a boundary more, the old way, to read its blocks); the first stage's
    ``first_reserve`` (a Ray call to the destination, which reserves at its own boundary),
    ``first_send`` (its KV written) and ``first_check`` (the source's post-stage boundary)."""
    m = {**(rep.get("marks") or {}), "order": t0, "start": rep.get("start_time")}
    ends = (("order", "order_received"), ("order_received", "dst_read"), ("dst_read", "start"),
            ("start", "first_stage"), ("first_stage", "first_reserved"), ("first_reserved", "first_sent"), ("first_sent", "first_copied"))
    return {name: None if m.get(a) is None or m.get(b) is None else m[b] - m[a]
            for name, (a, b) in zip(STEPS, ends, strict=True)}


def _steps_in(log: list[tuple[float, ...]], t0: float, t1: float | None) -> dict[str, float | int | None]:
    """The source's steps between the order and the first stage's end: their median wall
    time (a boundary wait is up to one step) and their wall over CPU seconds (above 1: the
    step thread waited for a core or the GIL, i.e. load)."""
    steps = [s for s in log if t1 is not None and s[0] >= t0 and s[1] <= t1]
    wall = sum(s[1] - s[0] for s in steps)
    cpu = sum(s[3] for s in steps)
    return {"num_steps": len(steps), "step_p50_s": statistics.median([s[1] - s[0] for s in steps]) if steps else None,
            "wall_over_cpu": wall / cpu if cpu > 0 else None}


def sample(cluster: Any, k: int, ages: list[float], one_boundary: bool = True) -> dict[str, Any]:
    """One order from instance k % 2 to the other, on a decoding source (``one_boundary``: the
    migration config's ``merge_boundaries``, this round's)."""
    import ray

    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest

    src, dst = f"instance-{k % 2}", f"instance-{(k + 1) % 2}"
    handles = cluster.instances
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    ray.get([handles[src].add_request.remote(GenerateRequest(f"cal{k}-{i}", [7 + i] * PROMPT_TOKENS, params, 0,
                                                             time.time(), client="calibrate"))
             for i in range(REQUESTS_PER_SAMPLE)])
    _poll(cluster, ages, lambda i: any(s["instance_id"] == src and s["num_running"] >= REQUESTS_PER_SAMPLE
                                       for s in i["instances"]))
    end = time.monotonic() + random.uniform(0.05, 0.3)  # some decode steps in, off any step's phase
    _poll(cluster, ages, lambda i: time.monotonic() >= end)
    t0 = time.monotonic()
    reports = ray.get(handles[src].migrate_out.remote(dst, handles[dst], {"merge_boundaries": one_boundary}),
                      timeout=60)
    t1 = time.monotonic()
    _poll(cluster, ages, _idle)
    first = reports[0] if reports else None
    marks = (first or {}).get("marks") or {}
    steps = _steps_in(ray.get(handles[src].step_log.remote(cpu=True), timeout=30), t0, marks.get("first_copied"))
    return {"src": src, "one_boundary": one_boundary, "returned_s": t1 - t0, "num_reports": len(reports),
            "breakdown_s": None if first is None else _breakdown(t0, first), **steps,
            "start_s": None if first is None else first["start_time"] - t0,
            "first_stage_s": None if first is None or "first_stage" not in marks else marks["first_stage"] - t0,
            "committed": None if first is None else first["committed"],
            "abort_reason": None if first is None else first.get("abort_reason"),
            "num_stages": None if first is None else first["num_stages"],
            "duration_s": None if first is None else first["duration"],
            "downtime_s": None if first is None else first.get("downtime")}


def _stats(xs: list[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"count": 0, "min": None, "p50": None, "p90": None, "max": None}
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
    return {"count": len(xs), "min": min(xs), "p50": statistics.median(xs), "p90": q[8], "max": max(xs)}


def _where_it_goes(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per span of ``_breakdown``, and the source's steps meanwhile: their median over the samples."""
    def med(xs: list[Any]) -> float | None:
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    rows = [s["breakdown_s"] for s in samples if s["breakdown_s"]]
    return {"count": len(rows), **{f"{name}_p50_s": med([r[name] for r in rows]) for name in STEPS},
            "start_p50_s": med([s["start_s"] for s in samples]),
            "first_stage_p50_s": med([s["first_stage_s"] for s in samples]),
            "duration_p50_s": med([s["duration_s"] for s in samples if s["committed"]]),
            "step_p50_s": med([s["step_p50_s"] for s in samples]),
            "wall_over_cpu_p50": med([s["wall_over_cpu"] for s in samples])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="the JSON (default: llumnix-results/calibrate_info_path.json)")
    ap.add_argument("--compare", action="store_true",
                    help="alternate, two samples each, the start at one source boundary with the old way, at three "
                         "(migration merge_boundaries false); the simulator's figures from the first")
    a = ap.parse_args()
    if a.samples < 1:
        raise SystemExit("calibrate_info_path: --samples must be >= 1")
    random.seed(a.seed)
    from llumnix.bench.machine import RESULTS_DIR, machine_info
    from llumnix.cluster.launcher import ClusterConfig, start_cluster

    load_before = os.getloadavg()[0]
    t_start = time.monotonic()
    cluster = start_cluster(ClusterConfig(
        model=a.model, instances=2, engine=ENGINE, namespace=f"calibrate-{time.time_ns()}",
        scheduling={"rescheduling": {"pairing": "even", "min_tokens_left": 4}}, reschedule_interval_s=0.5))
    ages: list[float] = []
    samples = []
    try:
        t_ready = time.monotonic()
        for k in range(a.samples):  # by twos, so each way has orders from both instances
            samples.append(sample(cluster, k, ages, one_boundary=not (a.compare and k // 2 % 2)))
            print(f"sample {k}: {samples[-1]}", flush=True)
    finally:
        cluster.shutdown()
    where = {way: _where_it_goes([s for s in samples if s["one_boundary"] == (way == "one_boundary")])
             for way in ("one_boundary", "three_boundaries")}
    samples_all, samples = samples, [s for s in samples if s["one_boundary"]]
    starts = [s["first_stage_s"] for s in samples if s["first_stage_s"] is not None]
    age = _stats(ages)
    start = _stats(starts)
    # a stage of a few blocks is its fixed cost (the reservation call, the boundary waits):
    # the copy of 2-3 blocks on one host takes well under a millisecond
    stage = _stats([s["duration_s"] / s["num_stages"] for s in samples if s["committed"] and s["num_stages"]])
    doc = {"issue": 45, "machine": machine_info(with_torch=False),
           "load_1m": {"before": load_before, "after": os.getloadavg()[0]},
           "settings": {"model": a.model, "engine": ENGINE, "requests_per_sample": REQUESTS_PER_SAMPLE,
                        "prompt_tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS, "samples": a.samples,
                        "reschedule_interval_s": 0.5, "rescheduling": {"pairing": "even", "min_tokens_left": 4},
                        "compare": a.compare},
           "wall_s": {"start_cluster": t_ready - t_start, "total": time.monotonic() - t_start},
           "status_age_s": age, "migration_start_s": start, "where_it_goes": where,
           "migrations": {"started": len(starts), "committed": sum(bool(s["committed"]) for s in samples),
                          "aborted": [s["abort_reason"] for s in samples if s["committed"] is False],
                          "duration_s": _stats([s["duration_s"] for s in samples if s["committed"]]),
                          "per_stage_s": stage,
                          "num_stages": [s["num_stages"] for s in samples if s["committed"]]},
           "simulator": {"status_delay_s": None if age["p50"] is None else max(0.0, float(age["p50"]) - SIM_REPORT_S / 2),
                         "migration_start_s": start["p50"], "stage_overhead_s": stage["p50"]},
           "samples": samples_all}
    out = a.out or Path(RESULTS_DIR) / "calibrate_info_path.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"status age at LlumSched P50 {age['p50']} s (n={age['count']}); order to first stage P50 "
          f"{start['p50']} s (n={start['count']}); simulator: {doc['simulator']}; {out}")
    for way, w in where.items():
        if w["count"]:
            print(f"{way}: " + ", ".join(f"{k} {v:.3f}" for k, v in w.items() if isinstance(v, float)), flush=True)


if __name__ == "__main__":
    main()
