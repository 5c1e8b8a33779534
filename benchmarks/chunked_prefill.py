"""Chunked prefill on the real engine: decode stalls while long prompts arrive.

One engine (SmolLM2 on this CPU) serves chat requests that decode steadily while long
prompts arrive now and then. Without chunked prefill every long prompt's prefill is a
step of its own, and every decoding request waits it out; with it the prompt is
prefilled ``--budget`` tokens a step beside the decodes. The same arrivals (wall clock,
the engine stepping as fast as it can) run on each setting, alternated over
``--rounds`` (these machines are noisy: compare within one run). Per setting: the gap
between consecutive tokens of the chat requests (P50, P99, max), the chats' and the
long prompts' time to first token, and the run's wall time. Writes
benchmarks/results/chunked_prefill.json.

It also checks the simulator's step model on the same steps: every executed batch is
timed by the simulator's executor over ``--profile`` (our engine's measured latency
profile, ``llumnix profile``), and the ratio predicted / measured is summarised per kind of
step: prefill, decode, and the mixed steps of chunked prefill, whose model (the chunk's
prefill cost plus the decodes' marginal cost) is not calibrated on anything else.

    .venv/bin/python benchmarks/chunked_prefill.py [--budgets 128 256 512] [--rounds 2] [--profile P]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from llumnix.bench.machine import machine_info, peak_rss_bytes, write_result
from llumnix.core.sampling_params import SamplingParams
from llumnix.llm import LLM
from llumnix.sim.executor import SimExecutor
from llumnix.sim.profile import load_profile

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards", "quietly", "judge", "boxing", "matches", "in", "the", "old", "town", "square"]


def text_of(llm: LLM, num_tokens: int, salt: int) -> list[int]:
    """A prompt of exactly ``num_tokens`` tokens, different per ``salt`` (no shared prefix)."""
    words, ids = [], []
    i = salt
    while len(ids) < num_tokens:
        words.append(f"{WORDS[i % len(WORDS)]}{i}")
        i += 7
        ids = llm.tokenizer.encode(" ".join(words))
    return ids[:num_tokens]


def workload(llm: LLM, args: argparse.Namespace) -> list[tuple[float, str, list[int], int]]:
    """(arrival s, id, prompt, max tokens): chats from t = 0, a long prompt every
    ``--long-every`` seconds from t = 1."""
    reqs = [(0.1 * i, f"chat{i}", text_of(llm, args.chat_tokens, i), args.chat_output)
            for i in range(args.chats)]
    reqs += [(1.0 + args.long_every * i, f"long{i}", text_of(llm, args.long_tokens, 1000 + i), args.long_output)
             for i in range(args.longs)]
    return sorted(reqs)


def run(llm: LLM, reqs: list[tuple[float, str, list[int], int]], budget: int | None,
        predictor: SimExecutor | None = None) -> dict:
    sched = llm.engine.scheduler  # one engine, its weights and cache warm, rescheduled per setting
    sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=budget or 4096,
                                       chunked_prefill=budget is not None)
    pending = list(reqs)
    arrival: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    steps = mixed = 0
    model_ratios: dict[str, list[float]] = {"prefill": [], "decode": [], "mixed": []}
    t0 = time.perf_counter()
    while pending or llm.engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            at, rid, ids, n = pending.pop(0)
            llm.engine.add_request(rid, ids, SamplingParams(max_tokens=n, ignore_eos=True))
            arrival[rid] = at
        if not llm.engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        batch = llm.engine.schedule()
        if batch.is_empty:
            continue
        steps += 1
        mixed += batch.is_mixed
        done = llm.executor.execute(batch)
        if predictor is not None and done.elapsed:
            kind = "mixed" if batch.is_mixed else "prefill" if batch.is_prefill else "decode"
            predicted = predictor.execute(batch).elapsed or 0.0
            model_ratios[kind].append(predicted / done.elapsed)
        outs = llm.engine.update(batch, done)
        t = time.perf_counter() - t0
        for o in outs:
            times.setdefault(o.request_id, []).extend([t] * len(o.new_token_ids))
    wall = time.perf_counter() - t0
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_total_blocks
    gaps = [b - a for rid, ts in times.items() if rid.startswith("chat") for a, b in zip(ts, ts[1:], strict=False)]
    gaps.sort()

    def ttft(prefix: str) -> list[float]:
        return [times[r][0] - arrival[r] for r in times if r.startswith(prefix)]

    def q(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    chat_ttft, long_ttft = ttft("chat"), ttft("long")
    return {"budget": budget, "wall_s": wall, "steps": steps, "mixed_steps": mixed,
            "chat_token_gap_s": {"p50": q(gaps, 0.5), "p99": q(gaps, 0.99), "max": gaps[-1],
                                 "mean": statistics.fmean(gaps), "n": len(gaps)},
            "chat_ttft_mean_s": statistics.fmean(chat_ttft), "long_ttft_mean_s": statistics.fmean(long_ttft),
            "long_ttft_max_s": max(long_ttft),
            "sim_model_predicted_over_measured": {k: {"n": len(v), "median": statistics.median(v)}
                                                  for k, v in model_ratios.items() if v},
            "outputs": {r: len(ts) for r, ts in sorted(times.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--budgets", type=int, nargs="+", default=[128, 256, 512],
                    help="chunked prefill token budgets to compare with the unchunked engine")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--chat-tokens", type=int, default=60)
    ap.add_argument("--chat-output", type=int, default=160)
    ap.add_argument("--longs", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=1000)
    ap.add_argument("--long-output", type=int, default=8)
    ap.add_argument("--long-every", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (serve's default per instance: 1)")
    ap.add_argument("--profile", default="benchmarks/fidelity/profile-smollm2-cpu.json",
                    help="latency profile the simulator's step model is checked with ('' to skip)")
    ap.add_argument("--out", default="benchmarks/results/chunked_prefill.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(args.model, max_num_seqs=64, kv_cache_bytes=256 * 2**20)
    reqs = workload(llm, args)
    predictor = SimExecutor(load_profile(args.profile)) if args.profile else None
    settings: list[int | None] = [None, *args.budgets]
    runs: dict[str, list[dict]] = {str(b or "off"): [] for b in settings}
    run(llm, [(0.0, rid, ids, n) for _, rid, ids, n in reqs if rid in ("chat0", "long0")], None)  # warm-up
    for r in range(args.rounds):
        for b in settings:
            res = run(llm, reqs, b, predictor)
            runs[str(b or "off")].append(res)
            g = res["chat_token_gap_s"]
            print(f"round {r} budget {b or 'off':>4}: chat token gap p50 {g['p50'] * 1e3:6.1f} ms p99 "
                  f"{g['p99'] * 1e3:6.1f} ms max {g['max'] * 1e3:6.1f} ms | TTFT chat {res['chat_ttft_mean_s']:.2f} s "
                  f"long {res['long_ttft_mean_s']:.2f} s | wall {res['wall_s']:.1f} s, {res['mixed_steps']} mixed steps",
                  flush=True)
    outputs = {k: v[0]["outputs"] for k, v in runs.items()}
    assert all(o == outputs["off"] for o in outputs.values()), "every setting produces every token"
    summary = {}
    for k, rs in runs.items():
        summary[k] = {m: statistics.fmean(r["chat_token_gap_s"][m] for r in rs) for m in ("p50", "p99", "max", "mean")}
        summary[k].update({m: statistics.fmean(r[m] for r in rs)
                           for m in ("chat_ttft_mean_s", "long_ttft_mean_s", "wall_s")})
    if predictor is not None:
        for kind in ("prefill", "decode", "mixed"):
            ratios = [r["sim_model_predicted_over_measured"][kind]["median"] for rs in runs.values() for r in rs
                      if kind in r["sim_model_predicted_over_measured"]]
            if ratios:
                print(f"simulator's step model over {kind} steps: predicted / measured, median of the runs' "
                      f"medians {statistics.median(ratios):.2f} ({len(ratios)} runs)")
    for k, s in summary.items():
        print(f"{k:>4}: gap p99 {s['p99'] * 1e3:.0f} ms (x{summary['off']['p99'] / s['p99']:.2f} vs off), "
              f"max {s['max'] * 1e3:.0f} ms, chat TTFT {s['chat_ttft_mean_s']:.2f} s, "
              f"long TTFT {s['long_ttft_mean_s']:.2f} s, wall {s['wall_s']:.1f} s")
    record = {"benchmark": "chunked_prefill", "machine": machine_info(), "peak_rss_bytes": peak_rss_bytes(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "summary_mean_over_rounds": summary, "runs": runs}
    write_result(args.out, record)


if __name__ == "__main__":
    main()
