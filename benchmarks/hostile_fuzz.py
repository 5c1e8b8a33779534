"""Hostile bodies against a real `llumnix serve` (issue 43): ``--num`` generated bodies over
the hot routes, /tokenize and /detokenize (``tests/gateway/hostile_bodies.py``: half hostile,
half to serve), 8 at a time. Counts the answers by route and status; any 5xx, any answer
slower than ``--hang-s`` and any block still in use once the cluster is idle (prefix
caching off, so a finished request holds none) is a failure, printed with its body.

    python -m benchmarks.hostile_fuzz [--num 10000] [--out ~/.cache/llumnix/bench/hostile_fuzz.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings
from tests.gateway.hostile_bodies import request

from llumnix.bench.cluster_server import ServeProcess, admin_cluster
from llumnix.bench.machine import machine_info, write_result


def generate(num: int, model: str, vocab: int, rng_seed: int) -> list[tuple[str, dict[str, Any]]]:
    """``num`` bodies drawn by hypothesis (generation only: nothing is shrunk here)."""
    out: list[tuple[str, dict[str, Any]]] = []

    @settings(max_examples=num, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(request(model, vocab))
    def draw(req: tuple[str, dict[str, Any]]) -> None:
        out.append(req)

    seed(rng_seed)(draw)()
    return out[:num]


async def send_all(url: str, bodies: list[tuple[str, dict[str, Any]]], concurrency: int,
                   hang_s: float, budget_s: float | None = None) -> dict[str, Any]:
    """Every body, ``concurrency`` at a time; with ``budget_s``, none is sent after that
    many seconds (what was answered is reported, with how many were not sent)."""
    counts: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    slowest = 0.0
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)

    deadline = None if budget_s is None else time.monotonic() + budget_s

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal slowest
        while not queue.empty() and (deadline is None or time.monotonic() < deadline):
            route, body = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                r = await client.post(url + route, content=json.dumps(body).encode(),
                                      headers={"content-type": "application/json"}, timeout=hang_s)
                status, text = r.status_code, r.text
            except httpx.HTTPError as e:
                status, text = 0, f"{type(e).__name__}: {e}"
            took = time.perf_counter() - t0
            slowest = max(slowest, took)
            counts[f"{route} {status}"] += 1
            done = sum(counts.values())
            if done % 1000 == 0:
                print(f"  {done} answered, {len(failures)} failures so far", flush=True)
            if status >= 500 or status == 0:
                failures.append({"route": route, "status": status, "answer": text[:300],
                                 "body": json.dumps(body)[:2000], "seconds": took})

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return {"counts": dict(sorted(counts.items())), "failures": failures, "slowest_s": slowest,
            "not_sent": queue.qsize()}


def blocks_in_use(url: str) -> dict[str, int]:
    return {i["instance_id"]: int(i.get("num_used_blocks", 0)) for i in admin_cluster(url).get("instances", ())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--hang-s", type=float, default=60.0)
    ap.add_argument("--budget-s", type=float, default=None, help="send no body after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--vocab", type=int, default=49152, help="the model's vocabulary size (SmolLM2's)")
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "llumnix" / "bench" / "hostile_fuzz.json")
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "serve.yaml"
        config.write_text(f"model: {args.model}\nengine: {{enable_prefix_caching: false}}\n"
                          "deployment: {instances: 2}\n")
        with ServeProcess(config, Path(tmp) / "serve.log") as server:
            bodies = generate(args.num, server.model, args.vocab, args.seed)
            print(f"{len(bodies)} bodies against {server.url}", flush=True)
            result = asyncio.run(send_all(server.url, bodies, args.concurrency, args.hang_s, args.budget_s))
            server.wait_idle()
            result["blocks_in_use_after"] = blocks_in_use(server.url)
            log_tail = Path(tmp, "serve.log").read_text().splitlines()[-20:]
    result.update({"settings": vars(args) | {"out": str(args.out)}, "wall_s": time.time() - t0,
                   "server_log_tail": log_tail, "machine": machine_info(with_torch=False)})
    n5 = sum(1 for f in result["failures"] if f["status"] >= 500)
    hangs = sum(1 for f in result["failures"] if f["status"] == 0)
    leaked = sum(result["blocks_in_use_after"].values())
    print(f"{sum(result['counts'].values())} answers: {n5} 5xx, {hangs} hangs or resets, {leaked} blocks in use "
          f"after; slowest {result['slowest_s']:.1f} s; {result['not_sent']} not sent (time budget); "
          f"{result['counts']}", flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
