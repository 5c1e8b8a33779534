"""Live migration across two Ray nodes against within one, over tcp and gloo.

Two ``ray start`` nodes on this machine (the head on this host's address with two
instance slots, a second node on 127.0.0.2 with one; tests/cluster/test_two_nodes.py
starts them) and a cluster of three instances joined by address, one per slot. One long
request per length is migrated back and forth across the nodes (head <-> second) and
within the head (head <-> head), ``--repeats`` times each way per transport, with
nothing else running. Per migration: the report's ``downtime`` (pause to commit) and
``duration`` (whole migration, pre-copy stages included).

Both "nodes" are one machine talking over loopback: the cross-node path is real (other
node, other address, Ray placement), the network is not. The point is that the path
works and what it costs here, not a network measurement.

    .venv/bin/python -m benchmarks.two_nodes              # SmolLM2 if installed
    .venv/bin/python -m benchmarks.two_nodes --lengths 256 --repeats 2 --model tiny
"""
from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from tests.cluster.test_two_nodes import SECOND_IP, SLOT, two_ray_nodes

from llumnix.bench.machine import machine_info, write_result
from llumnix.cluster.launcher import ClusterConfig, start_cluster
from llumnix.core.sampling_params import SamplingParams
from llumnix.core.wire import GenerateRequest

OUT = Path(__file__).parent / "results" / "two_nodes.json"


def _model(name: str) -> str:
    if name != "tiny":
        return name
    from tests.tiny_model import save_tiny_llama

    d = Path(tempfile.mkdtemp(prefix="llx-tiny-"))
    save_tiny_llama(d)
    return str(d)


def _wait_tokens(actor: Any, rid: str, n: int, timeout: float = 900.0) -> None:
    deadline = time.time() + timeout
    while ray.get(actor.num_output_tokens.remote(rid), timeout=300) < n:
        if time.time() > deadline:
            raise TimeoutError(f"{rid} did not reach {n} tokens")
        time.sleep(0.05)


def _places(cluster: Any) -> dict[str, str]:
    """{'head', 'head2', 'second'} -> instance id, by the address each KV receiver binds."""
    hosts = {iid: ray.get(a.kv_address.remote(), timeout=60)[0] for iid, a in cluster.instances.items()}
    second = [iid for iid, h in hosts.items() if h == SECOND_IP]
    head = sorted(iid for iid in hosts if iid not in second)
    if len(second) != 1 or len(head) != 2:
        raise RuntimeError(f"instances are not two on the head and one on the second node: {hosts}")
    return {"head": head[0], "head2": head[1], "second": second[0]}


def run_length(cluster: Any, places: dict[str, str], length: int, transports: list[str],
               repeats: int) -> list[dict[str, Any]]:
    actors = cluster.instances
    rid = f"t-{length}"
    vocab = int(cluster.info["vocab_size"])
    prompt = [(100 + i * 7919) % vocab for i in range(length)]
    # As much room as the context allows for every migration's few decode steps; aborted at the end.
    room = int(cluster.info["max_model_len"]) - length
    req = GenerateRequest(rid, prompt, SamplingParams(max_tokens=room, ignore_eos=True), 0, time.monotonic())
    home = places["head"]
    ray.get(actors[home].add_request.remote(req), timeout=60)
    _wait_tokens(actors[home], rid, 2)
    rows = []
    for transport in transports:
        for path, other in (("across", places["second"]), ("within", places["head2"])):
            # there and back: the request is home again after each pair
            for k in range(2 * repeats):
                src, dst = (home, other) if k % 2 == 0 else (other, home)
                time.sleep(0.1)  # a few ordinary steps between migrations
                rep = ray.get(actors[src].migrate_request.remote(rid, dst, actors[dst], {"timeout_s": 60.0},
                                                                 transport), timeout=600)
                if not rep["committed"]:
                    raise RuntimeError(f"{transport} {path} {src}->{dst}: {rep['abort_reason']}")
                row = {"length": length, "transport": transport, "path": path, "from": src, "to": dst,
                       "downtime_s": rep["downtime"], "duration_s": rep["duration"], "stages": rep["num_stages"],
                       "blocks": rep["num_blocks"], "bytes": rep["num_bytes"]}
                print(f"  {length:5d} {transport:4s} {path:6s} {src}->{dst}: downtime "
                      f"{rep['downtime'] * 1e3:7.1f} ms, total {rep['duration'] * 1e3:7.1f} ms", flush=True)
                rows.append(row)
    ray.get(actors[home].abort.remote(rid), timeout=60)
    return rows


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = sorted({(r["length"], r["transport"], r["path"]) for r in rows})
    out = []
    for length, transport, path in keys:
        sel = [r for r in rows if (r["length"], r["transport"], r["path"]) == (length, transport, path)]
        out.append({"length": length, "transport": transport, "path": path,
                    "downtime_ms": {k: round(v * 1e3, 2) if k != "n" else v
                                    for k, v in _stats([r["downtime_s"] for r in sel]).items()},
                    "duration_ms": {k: round(v * 1e3, 2) if k != "n" else v
                                    for k, v in _stats([r["duration_s"] for r in sel]).items()},
                    "mb": round(statistics.median(r["bytes"] for r in sel) / 1e6, 2)})
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    print(f"\n{'tokens':>6} {'transport':>9} {'path':>6} {'MB':>7}   {'downtime ms: median [min-max]':>30}"
          f"   {'total ms: median [min-max]':>30}")
    for s in summary:
        d, t = s["downtime_ms"], s["duration_ms"]
        print(f"{s['length']:6d} {s['transport']:>9} {s['path']:>6} {s['mb']:7.2f}   "
              f"{d['median']:12.1f} [{d['min']:7.1f}-{d['max']:7.1f}]   "
              f"{t['median']:12.1f} [{t['min']:7.1f}-{t['max']:7.1f}]")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' (default), 'tiny' (the tests' random Llama) "
                                                      "or a model path")
    p.add_argument("--lengths", default="256,1024,4096", help="comma-separated prompt lengths (tokens)")
    p.add_argument("--transports", default="tcp,gloo")
    p.add_argument("--repeats", type=int, default=3, help="migrations each way per transport and path")
    p.add_argument("--kv-cache-mb", type=int, default=512, help="KV cache of each instance")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop both nodes on the way out
    lengths = [int(x) for x in args.lengths.split(",")]
    transports = args.transports.split(",")
    engine = {"kv_cache_bytes": args.kv_cache_mb * 2**20, "max_num_seqs": 4, "max_num_batched_tokens": 8192}
    rows: list[dict[str, Any]] = []
    started = time.time()
    with two_ray_nodes(slots=(2, 1)) as nodes:
        cluster = start_cluster(ClusterConfig(
            model=_model(args.model), instances=3, engine=engine, ray_address=nodes.address,
            instance_resources={SLOT: 1}, scheduling={"rescheduling": {"enabled": False}},
            replace_lost_instances=False, namespace=f"two-nodes-bench-{time.time_ns()}"))
        try:
            places = _places(cluster)
            print(f"instances: {places}", flush=True)
            for n in lengths:
                rows += run_length(cluster, places, n, transports, args.repeats)
        finally:
            cluster.shutdown()
            ray.shutdown()
    summary = summarize(rows)
    print_table(summary)
    write_result(args.out, {
        "benchmark": "two_nodes", "model": args.model, "lengths": lengths, "transports": transports,
        "summary": summary, "rows": rows, "wall_s": round(time.time() - started, 1), "machine": machine_info(),
        "settings": {"repeats_each_way": args.repeats, "engine": engine, "torch_threads_per_instance": 1,
                     "nodes": "two `ray start` nodes on this one machine: the head on this host's address "
                              "(2 instance slots), the second on 127.0.0.2 (1 slot); all traffic is loopback",
                     "paths": "across: head instance <-> second-node instance; within: the two head instances",
                     "load": "one request migrated back and forth, nothing else running"}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
