"""Measurements of the idle cluster right before a trace: the serving path's latency,
decode step times, the decode neighbor factor and the prefill speed. Each sends a few
completions over HTTP and reads the instances' step logs."""
from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.fidelity.factors import prefill_split
from benchmarks.fidelity.workload import prompt_ids

from llumnix.bench.step_log import neighbor_effect
from llumnix.core.errors import LlumnixError


def probe_overhead(url: str, model: str, instances: dict[str, Any], vocab: int, n: int = 6) -> dict[str, Any]:
    """Serving-path latency of single requests on the idle cluster: client TTFT minus the
    duration of the engine step that produced the token (found in the step log)."""
    import httpx
    import ray

    added: list[float] = []
    with httpx.Client(timeout=120) as c:
        for k in range(n + 1):
            body = {"model": model, "prompt": prompt_ids(10_000 + k, 32, vocab), "max_tokens": 1,
                    "ignore_eos": True, "temperature": 0}
            t0 = time.monotonic()
            c.post(f"{url}/v1/completions", json=body).raise_for_status()
            total = time.monotonic() - t0
            steps = [s for log in ray.get([a.step_log.remote() for a in instances.values()], timeout=30)
                     for s in log if s[0] >= t0 and s[1] <= t0 + total]
            if k and steps:  # the first warms the path up
                start, end, _ = min(steps)
                added.append(total - (end - start))
            time.sleep(0.2)
    if not added:
        raise LlumnixError("fidelity: no probe request was found in the instances' step logs")
    return {"samples_s": added, "median_s": statistics.median(added)}


def post_all(client: Any, url: str, bodies: list[dict[str, Any]]) -> None:
    """Send the completion requests at once and wait for all of them."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(bodies)) as pool:
        list(pool.map(lambda b: client.post(f"{url}/v1/completions", json=b).raise_for_status(), bodies))


def step_window(instances: dict[str, Any], t0: float, t1: float,
                 prefill_flag: bool = False) -> list[list[tuple[float, ...]]]:
    """Each instance's steps that ran within [t0, t1], times relative to t0: (start, end,
    batch size), with ``prefill_flag`` also 1 for a prefill step and 0 for a decode step."""
    import ray

    logs = ray.get([a.step_log.remote(cpu=prefill_flag) for a in instances.values()], timeout=30)
    return [[(round(s[0] - t0, 4), round(s[1] - t0, 4), s[2], *((int(s[4]),) if prefill_flag else ()))
             for s in log if s[0] >= t0 and s[1] <= t1] for log in logs]


def probe_steps(url: str, model: str, instances: dict[str, Any], vocab: int,
                 per_instance: tuple[int, ...] = (1, 2, 4), max_tokens: int = 12) -> dict[str, Any]:
    """Decode step times of the live cluster before the trace: for each n, n requests per
    instance at once (the dispatcher spreads them), and the median duration of the steps
    that produced n tokens. The simulator can scale its profile by the ratio to what the
    profile predicts for the same steps: contention measured without the trace."""
    import httpx

    out: dict[str, Any] = {}
    with httpx.Client(timeout=300) as c:
        for n in per_instance:
            t0 = time.monotonic()
            post_all(c, url, [{"model": model, "prompt": prompt_ids(20_000 + 100 * n + i, 32, vocab),
                                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
                               for i in range(n * len(instances))])
            t1 = time.monotonic()
            window = step_window(instances, t0, t1)
            steps = [e - s for log in window for s, e, m in log if m == n]
            # Each decode step of n requests holds n * (32 + i) context tokens at output i.
            out[str(n)] = {"median_s": statistics.median(steps) if steps else None, "num_steps": len(steps),
                           "context_tokens": n * (32 + max_tokens // 2), "wall_s": t1 - t0,
                           "log": window}
            time.sleep(0.2)
    return out


def probe_neighbor(url: str, model: str, instances: dict[str, Any], vocab: int, rounds: int = 3,
                    max_tokens: int = 16) -> dict[str, Any]:
    """The neighbor effect on the live cluster before the trace: one request alone (one
    instance decodes, the other is idle) and two at once (the dispatcher puts one on each,
    both decode), in turn for ``rounds`` rounds, alternating which goes first. The steps
    of the whole probe, split by overlap (``neighbor_effect``), give the decode slowdown
    beside a stepping neighbor as the cluster has it, with its serving processes."""
    import httpx

    t0 = time.monotonic()
    k = 0
    with httpx.Client(timeout=300) as c:
        for r in range(rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                post_all(c, url, [{"model": model, "prompt": prompt_ids(30_000 + k + i, 32, vocab),
                                    "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
                                   for i in range(1, n + 1)])
                k += n
                time.sleep(0.1)
    t1 = time.monotonic()
    window = step_window(instances, t0, t1)
    effect = neighbor_effect(window) if len(window) == 2 else {"ratio_by_batch": {}}
    return {"ratio": effect["ratio_by_batch"].get("1"), "effect": effect, "log": window, "wall_s": t1 - t0}


def probe_prefill(url: str, model: str, instances: dict[str, Any], vocab: int, rounds: int = 4,
                   prompt_tokens: int = 32, hold_tokens: int = 40) -> dict[str, Any]:
    """Prefill steps on the live cluster before the trace: a one-token request alone (both
    instances idle) and one sent while another request decodes (``hold_tokens`` long;
    the dispatcher puts the short one on the idle instance), in turn for ``rounds``
    rounds, alternating which goes first. ``prefill_split`` gives the median prefill
    step alone and beside a decoding neighbor: the cluster's prefill speed against the
    profile's, and its prefill neighbor factor, with the serving processes in both (the
    bare engines' profile measures x1.09; the cluster's prefill steps ran 1.17-1.48x the
    profile under load in round 3)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def body(k: int, max_tokens: int) -> dict[str, Any]:
        return {"model": model, "prompt": prompt_ids(40_000 + k, prompt_tokens, vocab), "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}

    t0 = time.monotonic()
    k = 0
    with httpx.Client(timeout=300) as c, ThreadPoolExecutor(1) as background:
        for r in range(rounds):
            for beside in ((False, True) if r % 2 == 0 else (True, False)):
                hold = None
                if beside:
                    hold = background.submit(lambda b: c.post(f"{url}/v1/completions", json=b).raise_for_status(),
                                             body(k, hold_tokens))
                    k += 1
                    time.sleep(0.5)  # its prefill is over: it decodes
                c.post(f"{url}/v1/completions", json=body(k, 1)).raise_for_status()
                k += 1
                if hold is not None:
                    hold.result()
                time.sleep(0.1)
    t1 = time.monotonic()
    window = step_window(instances, t0, t1, prefill_flag=True)
    split = prefill_split(window) if len(window) == 2 else {"alone": [], "busy": []}
    return {"prompt_tokens": prompt_tokens, **split, "log": window, "wall_s": t1 - t0}

