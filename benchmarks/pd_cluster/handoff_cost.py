"""What a PD hand-off costs on the real CPU cluster (issue 33), at 256, 1k and 4k prompt
tokens, before and after chunk-wise pre-copy: `llumnix serve --instances 2
--prefill-instances 1` (SmolLM2, chunked prefill at serve's 256 tokens a step) with
``scheduling.pd.precopy_prefill_chunks`` false (before: the hand-off starts after the first
token and copies the whole prompt then) and true (after: each finished chunk's KV goes to
the decode instance while the next computes; the pause after the first token copies the
tail).

One measured streamed request at a time (random token ids, greedy, ``ignore_eos``,
``--max-tokens`` tokens, ``logprobs: 0`` so every token is its own event), in two scenarios:
``alone``, and ``behind``: a second prompt (``--behind`` tokens, one output token) sent
0.05 s after it, so it waits behind the measured prompt (FCFS; a 256-token prompt fills a
step's budget) and is still waiting when its first token is out and the hand-off happens
with prompt work waiting on the prefill instance (the request is then paused at once after
its first token rather than pre-copied while it decodes beside prefill chunks: the case
whose stall the issue is about).

Per request, from the client: TTFT, the gap between the first and the second token on the
stream, one decode step (the median gap after the second token, made on the decode
instance), the stall (the longest gap after the first token less that step: the request
may make a few tokens on the prefill instance, beside prefill chunks, before its pause)
and the excess (every gap's excess over a decode step, summed: all the stream lost); the
goal is a stall below one decode step. From ``/admin/cluster``'s latest hand-off:
bytes and blocks sent (all, and in the last stage), chunk stages, the hand-off's time
(migration start to commit) and its downtime (pause on the prefill instance to the first
step on the decode instance).

Repetitions alternate the two systems (before, after; then after, before; ...), each a fresh
`llumnix serve`; the machine is shared, so the load average is recorded per request.

    python benchmarks/pd_cluster/handoff_cost.py [--lengths 256,1024,4096] [--reps 3] [--out DIR]

Writes ``DIR/handoff_cost.json`` (default ``./llumnix-results/pd_cluster``, outside the
committed files) with the machine and settings, and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import Serve  # noqa: E402 - this folder's runner

from llumnix.bench.machine import RESULTS_DIR, machine_info, write_result  # noqa: E402

SYSTEMS = {"before": "false", "after": "true"}
"""``scheduling.pd.precopy_prefill_chunks`` of each system."""
FLAGS = ["--instances", "2", "--prefill-instances", "1"]


def stream(url: str, model: str, prompt: list[int], max_tokens: int) -> list[float]:
    """Arrival times (monotonic) of each token on the stream."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "logprobs": 0, "stream": True}
    times: list[float] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.monotonic()
            for ch in json.loads(line[6:]).get("choices", []):
                lp = ch.get("logprobs") or {}
                times += [now] * max(1, len(lp.get("tokens") or []))
    return times


def one_request(srv: Serve, model: str, length: int, max_tokens: int, rng: random.Random,
                behind: int) -> dict[str, Any]:
    before = srv.cluster()["pd"]["handoffs_done"]
    prompt = [rng.randrange(100, 40000) for _ in range(length)]
    other = [rng.randrange(100, 40000) for _ in range(behind)]
    load0 = os.getloadavg()[0]
    bg = None
    if behind:
        bg = threading.Timer(0.05, lambda: stream(srv.url, model, other, 1))
        bg.start()
    t0 = time.monotonic()
    times = stream(srv.url, model, prompt, max_tokens)
    if bg is not None:
        bg.join()
    pd: dict[str, Any] = {}
    for _ in range(20):  # the hand-off's report reaches LlumSched just after its commit
        pd = srv.cluster()["pd"]
        if pd["handoffs_done"] > before:
            break
        time.sleep(0.1)
    handoff = pd["handoffs_recent"][-1] if pd["handoffs_done"] > before else None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    step = statistics.median(gaps[1:]) if len(gaps) > 1 else None
    rec: dict[str, Any] = {"prompt_tokens": length, "scenario": "behind" if behind else "alone", "num_tokens": len(times), "ttft_s": times[0] - t0,
                           "gap_1_2_s": gaps[0] if gaps else None, "decode_step_s": step,
                           "load_avg_1m": [load0, os.getloadavg()[0]], "handoff": handoff}
    rec["gaps_s"] = gaps
    # the stall: the longest gap after the first token, less a decode step (the request may
    # decode a few tokens on the prefill instance before its pause, beside prefill chunks)
    rec["stall_s"] = None if step is None or not gaps else max(gaps) - step
    rec["stall_below_one_step"] = None if rec["stall_s"] is None else rec["stall_s"] < step
    rec["excess_s"] = None if step is None else sum(max(0.0, g - step) for g in gaps)  # all the stream lost
    if handoff and handoff.get("num_blocks"):
        per_block = handoff["num_bytes"] / handoff["num_blocks"]
        rec["last_stage_bytes"] = int(per_block * (handoff.get("num_last_stage_blocks") or 0))
    return rec


def run_system(name: str, lengths: list[int], max_tokens: int, seed: int, behind: int) -> list[dict[str, Any]]:
    cfg = Path(f"/tmp/pd_handoff_{name}.yaml")
    cfg.write_text(f"scheduling:\n  pd:\n    precopy_prefill_chunks: {SYSTEMS[name]}\n")
    rng = random.Random(seed)
    out = []
    with Serve(f"handoff-{name}", [*FLAGS, "--config", str(cfg)]) as srv:
        model = srv.model()
        stream(srv.url, model, [rng.randrange(100, 40000) for _ in range(32)], 4)  # warm-up
        for length, bh in ((n, b) for b in (0, behind) for n in lengths):
            rec = one_request(srv, model, length, max_tokens, rng, bh)
            rec.update(system=name, seed=seed)
            out.append(rec)
            h = rec["handoff"] or {}
            print(f"{name:6s} {rec['scenario']:6s} {length:5d} tok  TTFT {rec['ttft_s']:.2f}  gap1-2 {rec['gap_1_2_s']:.3f}  "
                  f"step {rec['decode_step_s']:.3f}  stall {rec['stall_s']:+.3f}  excess {rec['excess_s']:.3f}  sent {h.get('num_bytes', 0) / 1e6:.1f} MB"
                  f" (last stage {rec.get('last_stage_bytes', 0) / 1e6:.1f})  chunks {h.get('num_prefill_stages')}  "
                  f"hand-off {h.get('duration') or 0:.2f} s  downtime {h.get('downtime') or 0:.3f}  "
                  f"load {rec['load_avg_1m'][0]:.1f}", flush=True)
    return out


def _stat(values: list[float | None]) -> dict[str, float | None]:
    v = [x for x in values if x is not None]
    return {"median": statistics.median(v) if v else None, "min": min(v, default=None),
            "max": max(v, default=None), "n": len(v)}


def summary(records: list[dict[str, Any]], lengths: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, scenario, length in ((n, sc, ln) for sc in ("alone", "behind") for n in SYSTEMS for ln in lengths):
        rs = [r for r in records if r["system"] == name and r["prompt_tokens"] == length and r["scenario"] == scenario]
        if rs:
            hs = [r["handoff"] or {} for r in rs]
            out[f"{scenario}_{name}_{length}"] = {
                "bytes_sent": _stat([h.get("num_bytes") for h in hs]),
                "last_stage_bytes": _stat([r.get("last_stage_bytes") for r in rs]),
                "chunk_stages": _stat([h.get("num_prefill_stages") for h in hs]),
                "handoff_s": _stat([h.get("duration") for h in hs]),
                "downtime_s": _stat([h.get("downtime") for h in hs]),
                "ttft_s": _stat([r["ttft_s"] for r in rs]), "gap_1_2_s": _stat([r["gap_1_2_s"] for r in rs]),
                "decode_step_s": _stat([r["decode_step_s"] for r in rs]), "stall_s": _stat([r["stall_s"] for r in rs]),
                "excess_s": _stat([r["excess_s"] for r in rs]),
                "first_gap_stall_s": _stat([r["gap_1_2_s"] - r["decode_step_s"] for r in rs
                                            if r["gap_1_2_s"] is not None and r["decode_step_s"] is not None]),
                "stall_below_one_step": [r["stall_below_one_step"] for r in rs],
                "handoffs_seen": sum(1 for h in hs if h)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="256,1024,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--behind", type=int, default=1024, help="the 'behind' scenario's second prompt (0: none)")
    ap.add_argument("--out", default=f"{RESULTS_DIR}/pd_cluster")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    t0 = time.time()
    records: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for name in (("before", "after") if rep % 2 == 0 else ("after", "before")):
            records += run_system(name, lengths, args.max_tokens, rep, args.behind)
    result = {"machine": machine_info(with_torch=False), "flags": FLAGS, "systems": SYSTEMS,
              "settings": {"lengths": lengths, "reps": args.reps, "max_tokens": args.max_tokens, "behind": args.behind,
                           "stall": "longest gap after the first token less the median gap after the second",
                           "first_gap_stall": "gap between tokens 1 and 2 less that median",
                           "excess": "sum over gaps of the excess over that median"},
              "records": records, "summary": summary(records, lengths), "wall_s": time.time() - t0}
    print(json.dumps(result["summary"], indent=1))
    write_result(Path(args.out) / "handoff_cost.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
