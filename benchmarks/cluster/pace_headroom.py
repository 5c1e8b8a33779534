"""Does a model's real step stay under the paced one (issue 45)? N engines at once (as N
instances share the CPU), each serving batches of B requests to completion unpaced,
every step's real time set against what `--pace MODEL[:SCALE]` would hold it to.

    python -m benchmarks.cluster.pace_headroom MODEL [--pace a10-llama7b-serving] [--procs 4]
        [--batches 4,8,16,32] [--prompt 128] [--output 128] [--out F.json]

Per batch size: the median and P99 of real / modeled over the steps (prefill chunks and
decodes), and the share of steps that would overrun (real > modeled: a paced engine
counts them in ``llumnix:pace_overrun_steps``). The engines run serve's engine defaults
(chunked prefill, 256 tokens a step on cpu; one torch thread each).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any


def _one(model: str, pace: str, batches: list[int], prompt: int, output: int, seed: int) -> dict[int, list[float]]:
    import random

    import torch

    from llumnix.bench.cluster_bench import pace_latency
    from llumnix.core.sampling_params import SamplingParams
    from llumnix.engine.pace import StepPacer
    from llumnix.llm import LLM

    torch.set_num_threads(1)
    ratios: dict[int, list[float]] = {}

    class Probe(StepPacer):  # prices each step as a paced engine would, sleeps never
        def pace(self, batch: Any, started: float) -> None:
            ratios.setdefault(size, []).append((self.clock() - started) / self.modeled_s(batch))

    need = max(batches) * -(-(prompt + output) // 16) + 16
    llm = LLM(model, num_blocks=need, max_num_seqs=max(batches), chunked_prefill=True, max_num_batched_tokens=256)
    llm.engine.pacer = Probe(pace_latency(pace))
    rng = random.Random(seed)
    vocab = llm.loaded.config.vocab_size
    for size in batches:
        for i in range(size):
            llm.engine.add_request(f"{size}-{i}", [rng.randrange(vocab) for _ in range(prompt)],
                                   SamplingParams(max_tokens=output, ignore_eos=True))
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    return ratios


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--pace", default="a10-llama7b-serving")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--batches", default="4,8,16,32")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    load0, t0 = os.getloadavg(), time.time()
    with mp.get_context("spawn").Pool(a.procs) as pool:
        per_proc = pool.starmap(_one, [(a.model, a.pace, batches, a.prompt, a.output, i) for i in range(a.procs)])
    rows = []
    for b in batches:
        r = [x for p in per_proc for x in p.get(b, [])]
        rows.append({"batch": b, "steps": len(r), "real_over_modeled_p50": round(_q(r, 0.5), 3),
                     "real_over_modeled_p99": round(_q(r, 0.99), 3),
                     "overrun_share": round(sum(x > 1 for x in r) / len(r), 4)})
        print(f"batch {b:>3}: {len(r)} steps, real/modeled P50 {rows[-1]['real_over_modeled_p50']:.3f} "
              f"P99 {rows[-1]['real_over_modeled_p99']:.3f}, overrun {rows[-1]['overrun_share']:.2%}")
    result = {"model": a.model, "pace": a.pace, "procs": a.procs, "prompt": a.prompt, "output": a.output,
              "rows": rows, "loadavg_before": list(load0), "loadavg_after": list(os.getloadavg()),
              "wall_s": round(time.time() - t0, 1), "cpus": os.cpu_count()}
    print(f"load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}, {result['wall_s']} s")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
