"""Lite mode's added latency, two source trees side by side: the same three echo engines,
one lite gateway per tree, requests interleaved (direct, then through gateway A; direct,
then through gateway B), so machine load hits both alike.

    git archive HEAD~1 src | tar -x -C /tmp/base       # the baseline's sources
    python -m benchmarks.lite.ab_latency --a /tmp/base/src --b src --pairs 300 --max-tokens 1 16
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from llumnix.bench.machine import machine_info, write_result
from llumnix.cluster.startup import free_port

ROOT = Path(__file__).resolve().parents[2]


async def _one(s: aiohttp.ClientSession, url: str, max_tokens: int) -> float:
    body = {"model": "smollm2", "prompt": "The capital of France is a city called", "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    async with s.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status}: {await r.text()}")
        async for _ in r.content:
            pass
    return (time.perf_counter() - t0) * 1e3


async def _wait(s: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        try:
            async with s.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit(f"{url} never became healthy")


async def measure(direct: str, gateways: dict[str, str], pairs: int, max_tokens: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s:
        for url in gateways.values():
            await _wait(s, url)
        for _ in range(20):  # warm connections and caches
            for url in [direct, *gateways.values()]:
                await _one(s, url, max_tokens)
        added: dict[str, list[float]] = {k: [] for k in gateways}
        for _ in range(pairs):
            for name, url in gateways.items():
                a = await _one(s, direct, max_tokens)
                added[name].append(await _one(s, url, max_tokens) - a)
    return {k: {"p50_ms": statistics.median(v), "p90_ms": statistics.quantiles(v, n=10)[-1]} for k, v in added.items()}


def _start(argv: list[str], log: Path, pythonpath: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd="/tmp", env=env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="source tree A (the directory holding llumnix/)")
    p.add_argument("--b", required=True, help="source tree B")
    p.add_argument("--pairs", type=int, default=300)
    p.add_argument("--max-tokens", type=int, nargs="+", default=[1, 16])
    p.add_argument("--out", default=str(Path.home() / "lite-bench" / "ab-latency.json"))
    args = p.parse_args()
    logs = Path(args.out).parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ports = [free_port() for _ in range(3)]
    procs = [_start([sys.executable, "-m", "benchmarks.lite.echo_engine", "--port", str(port)],
                    logs / f"echo-{i}.log", str(ROOT)) for i, port in enumerate(ports)]
    gateways = {}
    for name, src in (("a", args.a), ("b", args.b)):
        port = free_port()
        argv = [sys.executable, "-m", "llumnix.lite", "--model", "smollm2", "--port", str(port)]
        for e in ports:
            argv += ["--engine-url", f"http://127.0.0.1:{e}"]
        procs.append(_start(argv, logs / f"gateway-{name}.log", str(Path(src).resolve())))
        gateways[name] = f"http://127.0.0.1:{port}"
    record: dict[str, Any] = {"benchmark": "lite-ab-added-latency", "machine": machine_info(with_torch=False),
                              "settings": vars(args), "results": {}}
    try:
        for n in args.max_tokens:
            res = asyncio.run(measure(f"http://127.0.0.1:{ports[0]}", gateways, args.pairs, n))
            record["results"][str(n)] = res
            print(f"max_tokens={n}: " + "  ".join(f"{k} added p50 {r['p50_ms']:.2f} p90 {r['p90_ms']:.2f} ms"
                                                  for k, r in res.items()), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        write_result(args.out, record)


if __name__ == "__main__":
    main()
