"""Lite's dispatch decisions apart from the engines: the bench's ``sharegpt`` traces
replayed over modelled single-slot FIFO engines (llama.cpp's server runs one request at a
time), lite's own ``Pool`` (its books updated at every dispatch and finish) against
round-robin, power-of-two, least-requests and an oracle that knows when each engine frees.

    python -m benchmarks.lite.replay_dispatch [--seeds 0 1 2 3 4 5] [--slowdown 1 1.7 2.2]

A request's service time is its prefill (6.6 ms a prompt token) plus its decode (25 ms an
output token): llama.cpp's own figures for SmolLM2 on one thread of this machine, times
``slowdown`` (three engines sharing two cores run at about 2/3 speed when all are busy).
What the model leaves out is the point of comparing it with the real runs: engines
sharing cores with each other and the routers, and the routers' own timing.
"""
from __future__ import annotations

import argparse
import heapq
import random
import statistics
from pathlib import Path

from benchmarks.lite.bench import pct
from benchmarks.lite.workloads import sharegpt

from llumnix.bench.machine import machine_info, write_result
from llumnix.lite.config import from_urls
from llumnix.lite.pool import Pool

CAPACITY = 0.6547385046756843
"""req/s: the bench's closed-loop measurement on three llama.cpp servers (session 26)."""
PREFILL_S, DECODE_S = 0.0066, 0.025
POLICIES = ("lite:llumnix", "lite:least-requests", "round-robin", "power-of-two", "least-requests", "oracle")


def replay(policy: str, seed: int, n: int, rate: float, slowdown: float) -> dict[str, float]:
    trace = sharegpt(seed, rate, n)
    clock = {"t": 0.0}
    pool, ids = None, []
    if policy.startswith("lite:"):
        cfg = from_urls([f"http://e{i}:1" for i in range(3)], "smollm2", dispatch=policy.split(":")[1])
        pool = Pool(cfg.pools[0], cfg, seed, clock=lambda: clock["t"])
        ids = list(pool.endpoints)
    rng = random.Random(seed)
    free_at = [0.0] * 3
    running: list[list[float]] = [[], [], []]  # finish times of each engine's requests
    finishing: list[tuple[float, int, str]] = []
    ttft = []
    for k, q in enumerate(trace):
        t = q.arrival_s
        while finishing and finishing[0][0] <= t:
            ft, e, rid = heapq.heappop(finishing)
            if pool is not None:
                clock["t"] = ft
                pool.endpoints[ids[e]].lrs.on_finish(rid)
        clock["t"] = t
        running = [[f for f in r if f > t] for r in running]
        n_prompt = len(q.prompt.split()) + 1  # these prompts' words are one token each
        if pool is not None:
            ep = pool.dispatch(f"r{k}", [rng.randrange(1000) for _ in range(n_prompt)], 0, set())
            assert ep is not None
            e = ids.index(ep.endpoint_id)
        elif policy == "round-robin":
            e = k % 3
        elif policy == "power-of-two":
            a, b = rng.sample(range(3), 2)
            e = a if len(running[a]) <= len(running[b]) else b
        elif policy == "least-requests":
            e = min(range(3), key=lambda i: (len(running[i]), i))
        else:  # oracle: the engine that frees first
            e = min(range(3), key=lambda i: (max(free_at[i], t), i))
        start = max(free_at[e], t)
        prefill = PREFILL_S * n_prompt * slowdown
        ttft.append(start + prefill - t)
        free_at[e] = start + prefill + DECODE_S * q.max_tokens * slowdown
        running[e].append(free_at[e])
        heapq.heappush(finishing, (free_at[e], e, f"r{k}"))
    return {"ttft_mean_s": statistics.fmean(ttft), "ttft_p99_s": pct(ttft, 0.99)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(6)))
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--fraction", type=float, default=0.85, help="of CAPACITY (the bench's near rate)")
    p.add_argument("--slowdown", type=float, nargs="+", default=[1.0, 1.7, 2.2])
    p.add_argument("--out", default=str(Path.home() / "lite-bench" / "replay-dispatch.json"))
    args = p.parse_args()
    runs = []
    for slowdown in args.slowdown:
        for seed in args.seeds:
            got = {pol: replay(pol, seed, args.n, args.fraction * CAPACITY, slowdown) for pol in POLICIES}
            runs.append({"slowdown": slowdown, "seed": seed, **got})
            best = min(got, key=lambda pol: got[pol]["ttft_mean_s"] if pol != "oracle" else float("inf"))
            print(f"slowdown {slowdown} seed {seed}: " + "  ".join(
                f"{pol} {r['ttft_mean_s']:.2f}/{r['ttft_p99_s']:.2f}" for pol, r in got.items()) + f"   best: {best}")
    write_result(args.out, {"benchmark": "lite-replay-dispatch", "machine": machine_info(with_torch=False),
                            "settings": vars(args), "runs": runs})


if __name__ == "__main__":
    main()
