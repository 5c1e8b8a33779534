"""The request path against sglang-router, side by side in one interleaved run (issue 30).

Two systems, each measured against its own direct path:

- ours: `llumnix gateway` (its own process, as deployed) + LlumSched over 2 instances of
  the tests' tiny random Llama (so the serving stack, not the model, dominates); direct =
  this process on the instances' request channels (token ids in and out, no HTTP);
- sglang-router over 2 zero-compute OpenAI workers (this file's ``worker``: 8 tokens at
  once); direct = the workers themselves, alternately.

Per round, in rotating order: sequential non-streaming latency, sequential streaming
time to first token, then 32 clients (non-streaming latency and throughput, streaming TTFT)
for a fixed time; the CPU the router processes (gateway + LlumSched; sglang-router) spend
in each phase, less what they burn idle (measured each round), per request. Then our
gateway's floor: its cheapest route (GET /v1/models) at the sequential phase's cadence and
back to back, CPU per request beyond idle. Medians over rounds with [min-max].

    python -m benchmarks.request_path [--rounds 5] [--out DIR]

sglang-router comes from another virtualenv (``--sglang-python``; its own pins): e.g.
``python -m venv /work/venv-sglr && /work/venv-sglr/bin/pip install sglang-router==0.3.2``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from llumnix.cluster.startup import free_port, wait_until_healthy

MAX_TOKENS = 8
PROMPT = "Hello there, how are you today?"


@contextlib.contextmanager
def process(args: list[str], ready_url: str) -> Iterator[psutil.Process]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_healthy(ready_url.removesuffix("/health"), proc, what=" ".join(args[:3]))
        yield psutil.Process(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_s(procs: list[psutil.Process]) -> float:
    """CPU seconds of ``procs``: the scheduler's own count of each thread's time on a CPU
    (``/proc/PID/task/*/schedstat``, nanoseconds), not the ticks ``cpu_times`` reads. A
    sequential phase spends ~0.2 s of router CPU; at 10 ms a tick that count is a sample
    of ~20 ticks, +-20% from round to round. (A thread that ends takes its count along:
    the routers' threads live as long as they do.)"""
    total = 0.0
    for p in procs:
        try:
            total += _sched_s(p.pid)
        except OSError:
            raise SystemExit(f"request_path: process {p.pid} of the run died (killed for memory? see Ray's "
                             "raylet.out); the run is void") from None
    return total


def _sched_s(pid: int) -> float:
    ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError), \
                open(f"/proc/{pid}/task/{tid}/schedstat") as f:  # a thread that just ended: not found
            ns += int(f.read().split()[0])
    return ns / 1e9


# -- a zero-compute OpenAI worker (sglang-router's backends) ---------------------------------
def run_worker(port: int) -> None:
    from aiohttp import web

    def chunk(i: int, chat: bool) -> bytes:
        choice = {"index": 0, "delta": {"content": f"t{i}"}} if chat else {"index": 0, "text": f"t{i}"}
        return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"".join(chunk(i, chat) for i in range(MAX_TOKENS)) + b"data: [DONE]\n\n")
            return resp
        text = "".join(f"t{i}" for i in range(MAX_TOKENS))
        choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
        return web.json_response({"id": "x", "choices": [choice], "usage": {"completion_tokens": MAX_TOKENS}})

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    for path in ("/health", "/health_generate", "/v1/models", "/get_server_info", "/get_model_info"):
        app.router.add_get(path, ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- clients -----------------------------------------------------------------------------------
Call = Callable[[bool], Awaitable[tuple[float, float]]]
"""One request: (seconds to the first token, seconds to the end); the argument: stream?"""


def http_call(session: Any, urls: list[str], model: str) -> Call:
    state = {"i": 0}

    async def call(stream: bool) -> tuple[float, float]:
        url = urls[state["i"] % len(urls)]
        state["i"] += 1
        body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
                "ignore_eos": True, "temperature": 0, "stream": stream}
        t0 = time.perf_counter()
        first = None
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{url}: {r.status} {await r.text()}")
            if not stream:
                await r.read()
            else:
                async for line in r.content:
                    if first is None and line.startswith(b"data: {") and b'"content":"' in line.replace(b" ", b"") \
                            and b'"content":""' not in line.replace(b" ", b""):
                        first = time.perf_counter() - t0
        end = time.perf_counter() - t0
        return (first if first is not None else end), end
    return call


class DirectChannels:
    """This process on the instances' request channels, as a gateway would be (no HTTP, no
    tokenization): requests round-robin over the instances."""

    def __init__(self, links: list[Any]) -> None:
        self.links = links
        self.waiting: dict[str, asyncio.Queue[Any]] = {}
        self.n = 0

    def on_outputs(self, instance_id: str, outputs: list[Any]) -> None:
        for o in outputs:
            q = self.waiting.get(o.request_id)
            if q is not None:
                q.put_nowait(o)

    def on_statuses(self, instance_id: str, statuses: list[Any]) -> None:
        pass

    def on_add_result(self, instance_id: str, request_id: str, error: BaseException | None) -> None:
        if error is not None and request_id in self.waiting:
            self.waiting[request_id].put_nowait(error)

    def call(self, ids: list[int], client: str) -> Call:
        from llumnix.core.sampling_params import SamplingParams
        from llumnix.core.wire import GenerateRequest

        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0)

        async def call(stream: bool) -> tuple[float, float]:
            self.n += 1
            rid = f"direct-{self.n}"
            q = self.waiting[rid] = asyncio.Queue()
            t0 = time.perf_counter()
            # As the gateway sends them: a non-streamed request's outputs come once, whole.
            self.links[self.n % len(self.links)].add(GenerateRequest(rid, ids, params, 0, time.time(),
                                                                     client=client, final_only=not stream))
            first = None
            try:
                while True:
                    o = await q.get()
                    if isinstance(o, BaseException):
                        raise o
                    if first is None:
                        first = time.perf_counter() - t0
                    if o.is_finished:
                        return first, time.perf_counter() - t0
            finally:
                del self.waiting[rid]
        return call


# -- phases ------------------------------------------------------------------------------------
async def sequential(call: Call, n: int, stream: bool) -> list[float]:
    return [(await call(stream))[0 if stream else 1] for _ in range(n)]


async def concurrent(call: Call, clients: int, seconds: float, stream: bool) -> tuple[list[float], int]:
    times: list[float] = []
    stop = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop:
            times.append((await call(stream))[0 if stream else 1])

    await asyncio.gather(*(client() for _ in range(clients)))
    return times, len(times)


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def measure_path(call: Call, procs: list[psutil.Process], idle_cores: float, args: argparse.Namespace
                       ) -> dict[str, float]:
    """One path, one round: every phase, with the routers' CPU per request beyond idle."""
    out: dict[str, float] = {}
    phases: list[tuple[str, Callable[[], Awaitable[tuple[list[float], int]]]]] = [
        ("seq", lambda: _counted(sequential(call, args.sequential, False))),
        ("seq_stream", lambda: _counted(sequential(call, args.sequential, True))),
        ("c32", lambda: concurrent(call, args.clients, args.seconds, False)),
        ("c32_stream", lambda: concurrent(call, args.clients, args.seconds, True))]
    for name, run in phases:
        c0, t0 = cpu_s(procs), time.perf_counter()
        times, n = await run()
        wall = time.perf_counter() - t0
        used = cpu_s(procs) - c0 - idle_cores * wall
        out[f"{name}_p50_ms"] = 1000 * p50(times)
        out[f"{name}_rps"] = n / wall
        out[f"{name}_cpu_ms_per_req"] = 1000 * used / max(1, n) if procs else float("nan")
    return out


async def _counted(coro: Awaitable[list[float]]) -> tuple[list[float], int]:
    xs = await coro
    return xs, len(xs)


async def floor(session: Any, url: str, procs: list[psutil.Process], idle_cores: float, n: int,
                period_s: float) -> float:
    """CPU per request beyond idle of the cheapest route through the same gateway (GET
    /v1/models: HTTP, the app, a small JSON body; no tokenizer, no instance), ``n`` of
    them one every ``period_s`` (0: back to back). What a request costs before any chat
    work, at the sequential phase's cadence: a process woken every 15 ms finds its caches
    cold, which a loop of requests back to back never sees."""
    c0, t0 = cpu_s(procs), time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        async with session.get(f"{url}/v1/models") as r:
            await r.read()
        if period_s > 0:
            await asyncio.sleep(max(0.0, period_s - (time.perf_counter() - t)))
    return 1000 * (cpu_s(procs) - c0 - idle_cores * (time.perf_counter() - t0)) / n


async def idle_burn(procs: list[psutil.Process], seconds: float) -> float:
    """Cores ``procs`` burn while nothing is asked of them. The event loop keeps running
    meanwhile: a blocked loop would miss the servers closing idle keep-alive connections
    and reuse them after (a 'Server disconnected' in the next phase)."""
    c0, t0 = cpu_s(procs), time.perf_counter()
    await asyncio.sleep(seconds)
    return (cpu_s(procs) - c0) / (time.perf_counter() - t0)


# -- the run -----------------------------------------------------------------------------------
def descendants_named(tag: str) -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if tag in " ".join(p.cmdline() if p.is_running() else [])]


async def open_links(cluster: Any, client: str, sink: Any) -> list[Any]:
    import ray

    from llumnix.cluster.link import InstanceLink

    setup = ray.get(cluster.llumsched.gateway_setup.remote(), timeout=30)
    links = []
    for iid, actor in sorted(cluster.instances.items()):
        host, port = ray.get(actor.channel_address.remote(), timeout=30)
        link = InstanceLink(iid, (host, port), setup["token"], client, sink)
        await link.open()
        asyncio.get_running_loop().create_task(link.run())
        links.append(link)
    return links


def run(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp
    from tests.tiny_model import save_tiny_llama

    from llumnix.cluster.launcher import ClusterConfig, start_cluster
    from llumnix.model import load_tokenizer

    model = Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    save_tiny_llama(model)
    cluster = start_cluster(ClusterConfig(model=str(model), instances=2, namespace=f"request-path-{time.time_ns()}"))
    rounds: list[dict[str, Any]] = []
    try:
        import ray

        ctx = ray.get_runtime_context()
        gw_port, router_port, w_ports = free_port(), free_port(), [free_port(), free_port()]
        gw_url, router_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{router_port}"
        w_urls = [f"http://127.0.0.1:{p}" for p in w_ports]
        with contextlib.ExitStack() as stack:
            gw = stack.enter_context(process(
                [sys.executable, "-m", "llumnix.cli", "gateway", "--ray-address", ctx.gcs_address,
                 "--namespace", ctx.namespace, "--port", str(gw_port), "--disable-log-requests"],
                f"{gw_url}/health"))
            llumsched = descendants_named("LlumSchedActor")
            for p in w_ports:
                stack.enter_context(process([sys.executable, "-m", "benchmarks.request_path", "worker",
                                             "--port", str(p)], f"http://127.0.0.1:{p}/health"))
            router = stack.enter_context(process(
                [args.sglang_python, "-m", "sglang_router.launch_router", "--worker-urls", *w_urls,
                 "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(router_port)],
                f"{router_url}/health"))
            ours, theirs = [gw, *llumsched], [router]
            tok = load_tokenizer(str(model))
            ids = tok.encode_chat([{"role": "user", "content": PROMPT}])

            async def main() -> None:
                sink = DirectChannels([])
                sink.links = await open_links(cluster, "bench-direct", sink)
                conn = aiohttp.TCPConnector(limit=0)
                async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
                    name = (await (await s.get(f"{gw_url}/v1/models")).json())["data"][0]["id"]
                    paths: dict[str, tuple[Call, list[psutil.Process], str]] = {
                        "ours_direct": (sink.call(ids, "bench-direct"), ours, "ours"),
                        "ours_gateway": (http_call(s, [gw_url], name), ours, "ours"),
                        "sglang_direct": (http_call(s, w_urls, "m"), theirs, "theirs"),
                        "sglang_router": (http_call(s, [router_url], "m"), theirs, "theirs")}
                    for call, _, _ in paths.values():  # warm connections, caches, JITs
                        await concurrent(call, 4, 1.0, False)
                    order = list(paths)
                    for r in range(args.rounds):
                        idle = {"ours": await idle_burn(ours, args.idle_seconds), "theirs": await idle_burn(theirs, 2.0)}
                        rec: dict[str, Any] = {"idle_cores_ours": idle["ours"], "idle_cores_theirs": idle["theirs"]}
                        for p in order[r % 4:] + order[:r % 4]:
                            call, procs, who = paths[p]
                            rec[p] = await measure_path(call, procs, idle[who], args)
                        period = 1 / rec["ours_gateway"]["seq_rps"]
                        rec["floor_paced_cpu_ms_per_req"] = await floor(s, gw_url, ours, idle["ours"],
                                                                        args.sequential, period)
                        rec["floor_tight_cpu_ms_per_req"] = await floor(s, gw_url, ours, idle["ours"],
                                                                        args.sequential, 0.0)
                        rounds.append(rec)
                        print(json.dumps({"round": r, **summary(rounds)["ratios"]}), flush=True)

            asyncio.run(main())
    finally:
        cluster.shutdown()
    return {"rounds": rounds, **summary(rounds)}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    def per(fn: Callable[[dict[str, Any]], float]) -> dict[str, float]:
        return stat([fn(r) for r in rounds])

    out: dict[str, Any] = {"idle_pct_core_ours": per(lambda r: 100 * r["idle_cores_ours"]),
                           "idle_pct_core_sglang_router": per(lambda r: 100 * r["idle_cores_theirs"])}
    for sys_, direct, routed in (("ours", "ours_direct", "ours_gateway"),
                                 ("sglang", "sglang_direct", "sglang_router")):
        out.update(_system_summary(per, sys_, direct, routed))
    if all("floor_paced_cpu_ms_per_req" in r for r in rounds):
        out["ours_floor_paced_cpu_ms_per_req"] = per(lambda r: r["floor_paced_cpu_ms_per_req"])
        out["ours_floor_tight_cpu_ms_per_req"] = per(lambda r: r["floor_tight_cpu_ms_per_req"])
        out["ours_seq_cpu_above_floor_ms_per_req"] = per(
            lambda r: r["ours_gateway"]["seq_cpu_ms_per_req"] - r["floor_paced_cpu_ms_per_req"])
    m = {k: v["median"] for k, v in out.items()}

    def ratio(ours: str, theirs: str) -> float | None:
        """Ours over sglang-router's added latency; None where theirs is within noise of 0."""
        return round(m[ours] / m[theirs], 2) if m[theirs] > 0.5 else None

    out["ratios"] = {
        "added_seq_ms": round(m["ours_added_seq_p50_ms"], 2),
        "added_seq_stream_ttft_ms": round(m["ours_added_seq_stream_p50_ms"], 2),
        "added_c32_ms": round(m["ours_added_c32_p50_ms"], 2),
        "added_c32_ms_sglang": round(m["sglang_added_c32_p50_ms"], 2),
        "added_c32_vs_sglang": ratio("ours_added_c32_p50_ms", "sglang_added_c32_p50_ms"),
        "added_c32_stream_ttft_ms": round(m["ours_added_c32_stream_p50_ms"], 2),
        "added_c32_stream_ttft_ms_sglang": round(m["sglang_added_c32_stream_p50_ms"], 2),
        "added_ttft_c32_vs_sglang": ratio("ours_added_c32_stream_p50_ms", "sglang_added_c32_stream_p50_ms"),
        "throughput_ratio": round(m["ours_c32_throughput_ratio"], 3),
        "throughput_ratio_sglang": round(m["sglang_c32_throughput_ratio"], 3),
        "cpu_ms_per_req_seq": round(m["ours_router_cpu_ms_per_req_seq"], 2),
        "cpu_ms_per_req_c32": round(m["ours_router_cpu_ms_per_req_c32"], 2),
        "idle_pct_core": round(m["idle_pct_core_ours"], 2)}
    if "ours_floor_paced_cpu_ms_per_req" in m:
        out["ratios"].update(floor_cpu_ms_per_req_paced=round(m["ours_floor_paced_cpu_ms_per_req"], 2),
                             floor_cpu_ms_per_req_tight=round(m["ours_floor_tight_cpu_ms_per_req"], 2),
                             cpu_ms_per_req_seq_above_floor=round(m["ours_seq_cpu_above_floor_ms_per_req"], 2))
    return out


def _system_summary(per: Callable[[Callable[[dict[str, Any]], float]], dict[str, float]], sys_: str, direct: str,
                    routed: str) -> dict[str, dict[str, float]]:
    out = {f"{sys_}_added_{ph}_p50_ms": per(lambda r, ph=ph: r[routed][f"{ph}_p50_ms"] - r[direct][f"{ph}_p50_ms"])
           for ph in ("seq", "seq_stream", "c32", "c32_stream")}
    out[f"{sys_}_c32_rps_direct"] = per(lambda r: r[direct]["c32_rps"])
    out[f"{sys_}_c32_rps_routed"] = per(lambda r: r[routed]["c32_rps"])
    out[f"{sys_}_c32_throughput_ratio"] = per(lambda r: r[routed]["c32_rps"] / r[direct]["c32_rps"])
    out[f"{sys_}_router_cpu_ms_per_req_seq"] = per(lambda r: r[routed]["seq_cpu_ms_per_req"])
    out[f"{sys_}_router_cpu_ms_per_req_c32"] = per(lambda r: r[routed]["c32_cpu_ms_per_req"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="run", choices=["run", "worker"])
    p.add_argument("--port", type=int, default=0, help="worker: its port")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sequential", type=int, default=100, help="requests per sequential phase (P50s of 40 moved by +-3 ms between rounds)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=6.0, help="length of each concurrent phase")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle window per round (CPU times tick at 10 ms)")
    p.add_argument("--sglang-python", default=os.environ.get("SGLANG_PYTHON", "/work/venv-sglr/bin/python"))
    p.add_argument("--out", default="llumnix-results", help="folder for the JSON (default ./llumnix-results)")
    args = p.parse_args()
    if args.what == "worker":
        run_worker(args.port)
        return
    from llumnix.bench.machine import machine_info, write_result

    res = run(args)
    res.update(machine=machine_info(with_torch=False), settings={k: v for k, v in vars(args).items() if k != "what"},
               max_tokens=MAX_TOKENS, prompt=PROMPT)
    print(json.dumps(res["ratios"], indent=1))
    write_result(Path(args.out) / f"request_path-{time.strftime('%Y%m%d-%H%M%S')}.json", res)


if __name__ == "__main__":
    main()
