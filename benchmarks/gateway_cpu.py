"""The gateway's own CPU per request, without a cluster behind it (issue 30).

`llumnix gateway`'s app (uvicorn with uvloop and httptools, every middleware, the real
SmolLM2 tokenizer and chat template, detokenization, metrics, the request log) over a
zero-compute backend that answers each request with ``--tokens`` outputs of one token at
once. A client in this process (aiohttp) sends chats; the gateway process's CPU time per
request is what the HTTP side of the request path costs, before any dispatch or channel.
Phases per round: sequential non-streaming, sequential streaming, then ``--clients``
concurrent clients non-streaming and streaming; idle burn subtracted. Medians over rounds
with [min-max].

    python -m benchmarks.gateway_cpu [--rounds 3] [--out DIR] [--profile SECONDS]

``--profile S`` also records the gateway with py-spy for S seconds of the concurrent
non-streaming phase (a speedscope JSON beside the results).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks.request_path import idle_burn, process

from llumnix.cluster.startup import free_port


class ZeroBackend:
    """Answers every request at once with ``tokens`` outputs of one token each."""

    max_model_len = 8192

    def __init__(self, tokens: int) -> None:
        from llumnix.model import load_tokenizer

        self.tokenizer = load_tokenizer("smollm2")
        self.model_name = "smollm2"
        self.vocab_size = 49152
        self.tokens = tokens

    def validate(self, num_prompt_tokens: int, params: Any) -> None:
        pass

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        from llumnix.core.batch import RequestMetrics, RequestOutput

        n = min(self.tokens, request.params.max_tokens or self.tokens)
        for i in range(n):
            await asyncio.sleep(0)
            last = i == n - 1
            metrics = RequestMetrics(request.arrival_time, time.time(), time.time(), time.time(),
                                     len(request.prompt_token_ids), n, 0, 0.0, 0, instance_id="zero") if last else None
            yield RequestOutput(request.request_id, [300 + i], i + 1, "length" if last else None, metrics=metrics)

    async def abort(self, request_id: str) -> None:
        pass

    async def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def cluster_info(self) -> dict[str, Any]:
        return {"instances": {}}

    async def drain_instance(self, instance_id: str) -> dict[str, Any]:
        return {}

    async def undrain_instance(self, instance_id: str) -> dict[str, Any]:
        return {}


def serve(port: int, tokens: int) -> None:
    from llumnix.cluster.startup import bind_port, serve_http
    from llumnix.gateway.app import build_app

    app = build_app(ZeroBackend(tokens), log_requests=False)
    serve_http(app, bind_port("127.0.0.1", port), "warning", 1.0, lambda: None)


async def run_round(url: str, proc: Any, args: argparse.Namespace) -> dict[str, float]:
    """One round: idle burn, then request_path's four phases against the gateway alone."""
    import aiohttp
    from benchmarks.request_path import concurrent, http_call, measure_path

    idle = await idle_burn([proc], args.idle_seconds)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        call = http_call(s, [url], "smollm2")
        await concurrent(call, 4, 1.0, False)  # warm
        return {"idle_pct_core": 100 * idle, **await measure_path(call, [proc], idle, args)}


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250",
                             "-f", "speedscope", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="run", choices=["run", "serve"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", type=int, default=8, help="outputs (one token each) per request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--profile", type=float, default=0.0, help="py-spy this many seconds of a c32 phase")
    p.add_argument("--out", default="llumnix-results")
    args = p.parse_args()
    if args.what == "serve":
        serve(args.port, args.tokens)
        return
    from llumnix.bench.machine import machine_info

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rounds: list[dict[str, float]] = []
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with process([sys.executable, "-m", "benchmarks.gateway_cpu", "serve", "--port", str(port),
                  "--tokens", str(args.tokens)], f"{url}/health") as proc:
        for r in range(args.rounds):
            spy = profile(proc.pid, args.profile, out_dir / "gateway_cpu_profile.json") \
                if args.profile and r == 0 else None
            rounds.append(asyncio.run(run_round(url, proc, args)))
            if spy is not None:
                spy.wait()
            print(json.dumps({"round": r, **{k: round(v, 3) for k, v in rounds[-1].items()}}), flush=True)
    summary = {k: {"median": statistics.median(r[k] for r in rounds), "min": min(r[k] for r in rounds),
                   "max": max(r[k] for r in rounds)} for k in rounds[0]}
    res = {"rounds": rounds, "summary": summary, "machine": machine_info(with_torch=False),
           "settings": {k: v for k, v in vars(args).items() if k not in ("what", "port")},
           "load_average": os.getloadavg()}
    path = out_dir / f"gateway_cpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: round(v["median"], 3) for k, v in summary.items()}))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
