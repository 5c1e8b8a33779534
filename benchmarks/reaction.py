"""Triggered rescheduling against periodic rounds, side by side in one run (issue 44):
two clusters of 2 tiny-model instances in one Ray session, alike but for
``rescheduling.trigger_gap_s`` (null: LlumSched's 0.5 s rounds only; 0.03: a status that
makes a source starts a pass at once), measured in alternation.

- LlumSched's CPU (schedstat, as ``request_path``) idle, and at ``--clients`` concurrent
  clients sending 8-token requests straight to the instances' request channels (LlumSched
  only follows the statuses and reschedules), per request beyond idle;
- the reaction (``llumnix:reschedule_reaction_seconds``): episodes of 8 long requests put
  on one instance while the other is idle, until a migration out of it is ordered; P50/P99
  of LlumSched's samples.

    python -m benchmarks.reaction [--rounds 3] [--episodes 10] [--out DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from benchmarks.request_path import PROMPT, DirectChannels, concurrent, cpu_s, open_links

MODES = {"periodic": None, "triggered": 0.03}
ENGINE = {"num_blocks": 512, "block_size": 4, "max_num_seqs": 16}
"""Room for 32 clients' short requests without a source (the default thresholds), and
episodes that make one in a few seconds."""
SCHEDULING: dict[str, Any] = {}
EPISODE_REQUESTS = 8
"""An episode's requests (40 prompt tokens, 300 out): their instance is a source (F < 3)
from about 245 tokens each."""


def start(model: Path, mode: str, gap: float | None, interval: float) -> Any:
    from llumnix.cluster.launcher import ClusterConfig, start_cluster

    return start_cluster(ClusterConfig(model=str(model), instances=2, engine=ENGINE,
                                       scheduling={"rescheduling": {**SCHEDULING, "trigger_gap_s": gap}},
                                       namespace=f"reaction-{time.time_ns()}", llumsched_name=f"llumsched-{mode}",
                                       reschedule_interval_s=interval))


def info(cluster: Any) -> dict[str, Any]:
    import ray

    return dict(ray.get(cluster.llumsched.cluster_info.remote(), timeout=30))


def wait_idle(cluster: Any, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        i = info(cluster)
        if all(s["num_running"] == 0 and s["num_waiting"] == 0 for s in i["instances"]) \
                and not i["migrations"]["in_flight"]:
            return
        time.sleep(0.1)
    raise SystemExit("reaction: the cluster did not go idle; the run is void")


def episode(cluster: Any, n: int) -> bool:
    """``EPISODE_REQUESTS`` long requests on one instance, the other idle: True once a migration out of it
    was ordered (a new reaction sample), False if the requests finished without one (a
    source for less than a round can be missed by periodic rounds)."""
    import ray

    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest

    before = info(cluster)["rescheduling"]["reaction"]["count"]
    src = cluster.instances[f"instance-{n % 2}"]
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    ray.get([src.add_request.remote(GenerateRequest(f"ep{n}-{i}", [1 + i] * 40, params, 0, time.time(),
                                                    client="bench-episodes")) for i in range(EPISODE_REQUESTS)])
    deadline = time.time() + 60
    while time.time() < deadline:
        i = info(cluster)
        if i["rescheduling"]["reaction"]["count"] > before:
            break
        if time.time() > deadline - 58 and not any(s["num_running"] or s["num_waiting"] for s in i["instances"]):
            return False  # over (its requests finished) without a migration out
        time.sleep(0.05)
    else:
        return False
    wait_idle(cluster)
    return True


async def load_window(cluster: Any, proc: psutil.Process, ids: list[int], clients: int, seconds: float,
                      idle_cores: float) -> dict[str, float]:
    sink = DirectChannels([])
    sink.links = await open_links(cluster, "bench-load", sink)
    call = sink.call(ids, "bench-load")
    await concurrent(call, 4, 1.0, False)  # warm
    c0, t0 = cpu_s([proc]), time.perf_counter()
    _, n = await concurrent(call, clients, seconds, False)
    wall = time.perf_counter() - t0
    used = cpu_s([proc]) - c0
    for link in sink.links:
        link.close()
    return {"rps": n / wall, "pct_core": 100 * used / wall,
            "cpu_ms_per_req": 1000 * (used - idle_cores * wall) / max(1, n)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.tiny_model import save_tiny_llama

    from llumnix.model import load_tokenizer

    model = Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    save_tiny_llama(model)
    clusters = {m: start(model, m, gap, args.reschedule_interval) for m, gap in MODES.items()}
    procs = {m: psutil.Process(info(c)["pid"]) for m, c in clusters.items()}
    ids = load_tokenizer(str(model)).encode_chat([{"role": "user", "content": PROMPT}])
    windows: list[dict[str, Any]] = []
    missed = dict.fromkeys(MODES, 0)
    try:
        time.sleep(3.0)  # the feeds' lines open
        for r in range(args.rounds):
            for m in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                c, p = clusters[m], procs[m]
                c0, t0 = cpu_s([p]), time.perf_counter()
                time.sleep(args.idle_seconds)
                idle = (cpu_s([p]) - c0) / (time.perf_counter() - t0)
                load = asyncio.run(load_window(c, p, ids, args.clients, args.seconds, idle))
                wait_idle(c)
                for e in range(args.episodes):
                    missed[m] += not episode(c, r * args.episodes + e)
                w = {"round": r, "mode": m, "idle_pct_core": 100 * idle, **{f"c{args.clients}_{k}": v
                                                                              for k, v in load.items()}}
                windows.append(w)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in w.items()}), flush=True)
        infos = {m: info(c) for m, c in clusters.items()}
    finally:
        for c in clusters.values():
            c.shutdown()
    return {"windows": windows, "summary": summary(windows, infos, missed, args.clients)}


def summary(windows: list[dict[str, Any]], infos: dict[str, dict[str, Any]], missed: dict[str, int],
            clients: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in MODES:
        ws = [w for w in windows if w["mode"] == m]
        resched = infos[m]["rescheduling"]
        reaction = resched["reaction"]
        out[m] = {"idle_pct_core": round(statistics.median(w["idle_pct_core"] for w in ws), 3),
                  f"c{clients}_cpu_ms_per_req": round(statistics.median(w[f"c{clients}_cpu_ms_per_req"] for w in ws), 3),
                  f"c{clients}_rps": round(statistics.median(w[f"c{clients}_rps"] for w in ws), 1),
                  "reaction_count": reaction["count"], "reaction_p50_s": reaction["p50_s"],
                  "reaction_p99_s": reaction["p99_s"], "reaction_max_s": max(reaction["recent_s"], default=None),
                  "episodes_without_migration": missed[m], "num_passes": resched["num_passes"],
                  "num_triggers": resched["num_triggers"], "migrations_committed": infos[m]["migrations"]["committed"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--episodes", type=int, default=10, help="reaction episodes per mode and round")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=6.0, help="length of each load window")
    p.add_argument("--idle-seconds", type=float, default=8.0, help="length of each idle window")
    p.add_argument("--reschedule-interval", type=float, default=0.5, help="LlumSched's periodic rounds (s)")
    p.add_argument("--out", default="llumnix-results", help="folder for the JSON (default ./llumnix-results)")
    args = p.parse_args()
    from llumnix.bench.machine import machine_info, write_result

    res = run(args)
    res.update(machine=machine_info(with_torch=False), settings={**vars(args), "engine": ENGINE,
                                                                  "rescheduling": SCHEDULING, "modes": MODES})
    print(json.dumps(res["summary"], indent=1))
    write_result(Path(args.out) / f"reaction-{time.strftime('%Y%m%d-%H%M%S')}.json", res)


if __name__ == "__main__":
    main()
