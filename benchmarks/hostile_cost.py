"""What one request at the documented bounds costs everybody else (issue 43).

A real `llumnix serve` (2 instances of SmolLM2 on this CPU). For each hostile shape, every
field at its documented limit (docs/serving.md, "Bounds"), a 16-token probe request is
sent while the hostile request runs, and again while its *plain twin* runs: the same
``n``, prompt and ``max_tokens`` without the hostile fields. Two ratios per shape:

- ``vs_twin``: the probe's latency beside the hostile request over beside its twin. This
  is the work budget's test: the bounded fields must not make a request cost more than a
  request of its size (the 4-million ``stop_token_ids`` request of the issue made every
  step of both instances take 11 s);
- ``vs_unloaded``: over the probe alone, which also counts the fair cost of sharing
  the batch with ``n`` choices.

Meanwhile a thread samples ``/live`` every 20 ms; the longest answer is how long the
gateway's event loop was held. Medians over ``--runs`` (3) with [min, max].

    python -m benchmarks.hostile_cost [--runs 3] [--out ~/.cache/llumnix/bench/hostile_cost.json]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from llumnix.bench.cluster_server import ServeProcess
from llumnix.bench.machine import machine_info, write_result
from llumnix.core.sampling_params import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS

N, MAX_TOKENS = 16, 48
PROMPT = "Write a long story about a lighthouse keeper and the sea."
BASE = {"prompt": PROMPT, "n": N, "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS, "ignore_eos": True,
        "temperature": 0.5}
CASES: dict[str, dict[str, Any]] = {
    "stop_token_ids": {"stop_token_ids": list(range(1, MAX_STOP_TOKEN_IDS + 1))},
    "logit_bias": {"logit_bias": {str(i): 0.5 for i in range(1, MAX_LOGIT_BIAS + 1)}},
    "stop_strings": {"stop": [chr(97 + i) * MAX_STOP_CHARS for i in range(MAX_STOP_STRINGS)], "min_tokens": 0,
                     "ignore_eos": True},
    "logprobs": {"logprobs": 20},
    "penalties": {"repetition_penalty": 1.3, "frequency_penalty": 1.0, "presence_penalty": 1.0},
    "everything": {"stop_token_ids": list(range(1, MAX_STOP_TOKEN_IDS + 1)),
                   "logit_bias": {str(i): 0.5 for i in range(1, MAX_LOGIT_BIAS + 1)},
                   "stop": [chr(97 + i) * MAX_STOP_CHARS for i in range(MAX_STOP_STRINGS)],
                   "logprobs": 20, "repetition_penalty": 1.3, "frequency_penalty": 1.0},
}
PROBE = {"prompt": "Hello", "max_tokens": 16, "min_tokens": 16, "ignore_eos": True, "temperature": 0}


class LiveSampler:
    """``/live`` every 20 ms on its own thread and connection; the longest answer since reset."""

    def __init__(self, url: str) -> None:
        self.url, self.longest, self._stop = url, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LiveSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def take(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                client.get(f"{self.url}/live")
                self.longest = max(self.longest, time.perf_counter() - t0)
                self._stop.wait(0.02)


async def _probe(client: httpx.AsyncClient, url: str, model: str) -> float:
    t0 = time.perf_counter()
    r = await client.post(f"{url}/v1/completions", json={"model": model, **PROBE})
    r.raise_for_status()
    return time.perf_counter() - t0


async def _beside(url: str, model: str, body: dict[str, Any] | None) -> float:
    """The probe's latency while ``body`` runs (admitted half a second before); the
    request is then cancelled (the gateway aborts it when its client leaves)."""
    async with httpx.AsyncClient(timeout=600) as client:
        task = None
        if body is not None:
            task = asyncio.ensure_future(client.post(f"{url}/v1/completions", json={"model": model, **body}))
            await asyncio.sleep(0.5)
        latency = await _probe(client, url, model)
        if task is not None:
            if task.done():
                (await task).raise_for_status()
            task.cancel()
        return latency


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def measure(server: ServeProcess, runs: int) -> dict[str, Any]:
    url, model = server.url, server.model
    out: dict[str, Any] = {"cases": {}}
    with LiveSampler(url) as live:
        asyncio.run(_beside(url, model, None))  # warm-up
        unloaded = [asyncio.run(_beside(url, model, None)) for _ in range(5)]
        out["probe_unloaded_s"] = _spread(unloaded)
        out["live_unloaded_s"] = live.take()
        base = statistics.median(unloaded)
        for name, fields in CASES.items():
            rec: dict[str, list[float]] = {"hostile_s": [], "twin_s": [], "live_hostile_s": [], "live_twin_s": []}
            for _ in range(runs):
                for kind, body in (("hostile", {**BASE, **fields}), ("twin", BASE)):
                    server.wait_idle()
                    live.take()
                    rec[f"{kind}_s"].append(asyncio.run(_beside(url, model, body)))
                    rec[f"live_{kind}_s"].append(live.take())
            ratios = [h / t for h, t in zip(rec["hostile_s"], rec["twin_s"], strict=True)]
            out["cases"][name] = {**{k: _spread(v) for k, v in rec.items()}, "vs_twin": _spread(ratios),
                                  "vs_unloaded": _spread([h / base for h in rec["hostile_s"]])}
            c = out["cases"][name]
            print(f"{name:15s} probe beside it {c['hostile_s']['median']:.2f} s, beside its twin "
                  f"{c['twin_s']['median']:.2f} s: x{c['vs_twin']['median']:.2f} "
                  f"[{c['vs_twin']['min']:.2f}-{c['vs_twin']['max']:.2f}] the twin, "
                  f"x{c['vs_unloaded']['median']:.2f} unloaded; /live at most "
                  f"{max(rec['live_hostile_s']) * 1e3:.0f} ms", flush=True)
    server.wait_idle()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "llumnix" / "bench" / "hostile_cost.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "serve.yaml"
        config.write_text(f"model: {args.model}\ndeployment: {{instances: 2}}\n")
        t0 = time.time()
        with ServeProcess(config, Path(tmp) / "serve.log") as server:
            record = measure(server, args.runs)
    record.update({"settings": {"runs": args.runs, "model": args.model, "n": N, "max_tokens": MAX_TOKENS,
                                "instances": 2, "base": BASE, "probe": PROBE},
                   "wall_s": time.time() - t0, "machine": machine_info(with_torch=False)})
    write_result(args.out, record)


if __name__ == "__main__":
    main()
