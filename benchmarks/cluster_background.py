"""What a busy cluster costs the gateway and LlumSched when none of the work goes through
them (issue 30): requests sent straight to the instances' request channels from this
process, the way ``request_path``'s direct path does, while a ``llumnix gateway`` and
LlumSched only follow the statuses. Alternating windows: idle, then sequential
non-streamed 8-token requests; CPU of each process per window (schedstat) as a share
of one core.

    python -m benchmarks.cluster_background [--rounds 3] [--reschedule-interval 0.5] [--out DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.request_path import (
    PROMPT,
    DirectChannels,
    cpu_s,
    descendants_named,
    free_port,
    open_links,
    process,
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from tests.tiny_model import save_tiny_llama

    from llumnix.cluster.launcher import ClusterConfig, start_cluster
    from llumnix.model import load_tokenizer

    model = Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    save_tiny_llama(model)
    cluster = start_cluster(ClusterConfig(model=str(model), instances=2, namespace=f"background-{time.time_ns()}",
                                          reschedule_interval_s=args.reschedule_interval))
    windows: list[dict[str, Any]] = []
    try:
        ctx = ray.get_runtime_context()
        port = free_port()
        with process([sys.executable, "-m", "llumnix.cli", "gateway", "--ray-address", ctx.gcs_address,
                      "--namespace", ctx.namespace, "--port", str(port), "--disable-log-requests"],
                     f"http://127.0.0.1:{port}/health") as gw:
            llumsched = descendants_named("LlumSchedActor")
            ids = load_tokenizer(str(model)).encode_chat([{"role": "user", "content": PROMPT}])

            async def main() -> None:
                sink = DirectChannels([])
                sink.links = await open_links(cluster, "bench-direct", sink)
                call = sink.call(ids, "bench-direct")
                for _ in range(30):
                    await call(False)
                for r in range(args.rounds):
                    for kind in ("idle", "busy"):
                        g0, l0, t0, n = cpu_s([gw]), cpu_s(llumsched), time.perf_counter(), 0
                        while time.perf_counter() - t0 < args.seconds:
                            if kind == "idle":
                                await asyncio.sleep(0.1)
                            else:
                                await call(False)
                                n += 1
                        wall = time.perf_counter() - t0
                        w = {"round": r, "kind": kind, "req_per_s": n / wall,
                             "gateway_pct_core": 100 * (cpu_s([gw]) - g0) / wall,
                             "llumsched_pct_core": 100 * (cpu_s(llumsched) - l0) / wall}
                        windows.append(w)
                        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in w.items()}),
                              flush=True)

            asyncio.run(main())
    finally:
        cluster.shutdown()

    def med(kind: str, key: str) -> dict[str, float]:
        xs = [w[key] for w in windows if w["kind"] == kind]
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}

    return {"windows": windows, "summary": {f"{kind}_{key}": med(kind, key) for kind in ("idle", "busy")
                                            for key in ("gateway_pct_core", "llumsched_pct_core", "req_per_s")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0, help="length of each window")
    p.add_argument("--reschedule-interval", type=float, default=0.5, help="LlumSched's rounds (s)")
    p.add_argument("--out", default="llumnix-results", help="folder for the JSON (default ./llumnix-results)")
    args = p.parse_args()
    from llumnix.bench.machine import machine_info, write_result

    res = run(args)
    res.update(machine=machine_info(with_torch=False), settings=vars(args))
    print(json.dumps(res["summary"], indent=1))
    write_result(Path(args.out) / f"cluster_background-{time.strftime('%Y%m%d-%H%M%S')}.json", res)


if __name__ == "__main__":
    main()
