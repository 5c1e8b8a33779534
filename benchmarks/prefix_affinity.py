"""Prefix affinity at dispatch on the serving cluster: multi-turn chats over two instances.

Each conversation starts with a document of its own (about ``--doc-tokens`` tokens) and
asks ``--turns`` questions about it; each turn's prompt is the whole conversation so far,
so it starts with the previous turn's prompt. With prefix caching on every instance, a
turn that lands where the previous one ran reads the conversation's KV from the cache;
elsewhere it prefills all of it. The cluster runs twice, identical but for the dispatch
policy: the paper's ``llumnix`` (freeness) and ``llumnix`` with ``prefix: true``
(``policy/prefix_affinity.py``). The KV cache per instance (``--kv-cache-mib``) holds
about half the conversations, so without affinity each instance must hold all of them.

Runs alternate (off, on, on, off, ... for ``--rounds``) in one Ray session; these
machines are noisy, so the ratio of the pooled figures is what to quote. Cached prompt
tokens come from each answer's ``usage.prompt_tokens_details.cached_tokens``. Writes
benchmarks/results/prefix_affinity.json.

    .venv/bin/python benchmarks/prefix_affinity.py [--conversations 8] [--turns 5] [--rounds 2]
        [--serve-defaults]   (the 'on' arm with serve's slack ratio 2, selection freed and
                              the index forgetting what the engines report evicted)
        [--evictions-ab]     (both arms as serve runs them; 'off' without the eviction reports:
                              writes benchmarks/results/prefix_affinity_evictions.json)
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import httpx

from llumnix.bench.machine import machine_info, write_result
from llumnix.bench.serve_bench import inprocess_gateway, sse_chunks
from llumnix.cluster.launcher import ClusterConfig, start_cluster
from llumnix.model import load_tokenizer

WORDS = ["river", "stone", "market", "lantern", "engine", "harbor", "garden", "violet", "copper",
         "meadow", "signal", "winter", "orchard", "canyon", "pilot", "ledger", "thunder", "marble",
         "falcon", "cedar", "prism", "voyage", "ember", "quartz", "glacier", "saddle", "beacon",
         "willow", "compass", "tundra"]
MODEL = "smollm2"
QUESTIONS = ["Summarise the document in one sentence.", "Which word appears first?",
             "Name three words from it.", "Is the document about a place?", "What is its last word?",
             "Does it mention a river?", "Give it a title.", "How long is it, roughly?"]


def document(rng: random.Random, tok: Any, num_tokens: int) -> str:
    words: list[str] = []
    while len(tok.encode(" ".join(words))) < num_tokens:
        words += rng.choices(WORDS, k=16)
    return " ".join(words)


async def turn(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]],
               max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    start, first, text, usage = time.perf_counter(), None, [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in sse_chunks(r):
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"]))
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices") or ():
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - start
                    text.append(piece)
    assert usage is not None and first is not None
    return {"ttft_s": first, "e2e_s": time.perf_counter() - start, "text": "".join(text),
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


async def conversations(url: str, docs: list[str], turns: int, max_tokens: int,
                        think_s: float, seed: int) -> list[list[dict[str, Any]]]:
    async with httpx.AsyncClient(timeout=600) as client:
        global MODEL
        MODEL = (await client.get(url + "/v1/models")).json()["data"][0]["id"]

        async def one(c: int) -> list[dict[str, Any]]:
            rng = random.Random(seed * 1000 + c)  # the same think times in every run
            await asyncio.sleep(0.5 * c)  # staggered starts
            messages = [{"role": "system", "content": "Answer briefly."},
                        {"role": "user", "content": f"Here is a document:\n{docs[c]}\n\n{QUESTIONS[0]}"}]
            rows = []
            for k in range(turns):
                row = await turn(client, url, messages, max_tokens)
                rows.append({"conversation": c, "turn": k, **row})
                messages += [{"role": "assistant", "content": row["text"]},
                             {"role": "user", "content": QUESTIONS[(k + 1 + c) % len(QUESTIONS)]}]
                await asyncio.sleep(rng.expovariate(1 / think_s))
            return rows

        return list(await asyncio.gather(*(one(c) for c in range(len(docs)))))


def arm_scheduling(on: bool, args: argparse.Namespace) -> dict[str, Any]:
    """The scheduling config of one arm."""
    serve = args.serve_defaults or args.evictions_ab
    params: dict[str, Any] = {"prefix": True} if on or args.evictions_ab else {}
    scheduling: dict[str, Any] = {"dispatch": {"policy": "llumnix", "params": params}}
    if params and serve:  # what `llumnix serve` adds with prefix caching on
        params["prefix_slack_ratio"] = 2.0
        scheduling["dispatch"]["prefix_evictions"] = on
        scheduling["rescheduling"] = {"selection": "freed"}
    return scheduling


def run_once(prefix: bool, args: argparse.Namespace, docs: list[str], tok: Any, n: int) -> dict[str, Any]:
    scheduling = arm_scheduling(prefix, args)
    cfg = ClusterConfig(instances=2, namespace=f"prefix-affinity-{n}",
                        engine={"kv_cache_bytes": args.kv_cache_mib * 2**20, "enable_prefix_caching": True},
                        scheduling=scheduling, llumsched_name=f"llumsched-prefix-affinity-{n}")
    cluster = start_cluster(cfg)
    try:
        with inprocess_gateway(cluster, tok) as url:
            t0 = time.perf_counter()
            convs = asyncio.run(conversations(url, docs, args.turns, args.max_tokens, args.think_s, args.seed))
            wall = time.perf_counter() - t0
            info = httpx.get(f"{url}/admin/cluster", timeout=30).json()
            forgotten = sum(i.get("prefix_blocks_forgotten") or 0 for i in info["instances"])
    finally:
        cluster.shutdown()
    rows = [r for conv in convs for r in conv]
    later = [r for r in rows if r["turn"] > 0]
    return {"prefix_affinity": prefix, "scheduling": scheduling, "wall_s": round(wall, 2),
            "prefix_blocks_forgotten": forgotten, "rows": rows,
            "later_turns": {
                "ttft_mean_s": statistics.mean(r["ttft_s"] for r in later),
                "ttft_p50_s": statistics.median(r["ttft_s"] for r in later),
                "ttft_max_s": max(r["ttft_s"] for r in later),
                "e2e_mean_s": statistics.mean(r["e2e_s"] for r in later),
                "cached_fraction": sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=350)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--think-s", type=float, default=3.0,
                    help="mean of the exponential pause between an answer and the next turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-cache-mib", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs (off/on, then on/off, ...)")
    ap.add_argument("--serve-defaults", action="store_true",
                    help="the 'on' arm as `llumnix serve` runs it: also a slack ratio of 2, selection freed "
                         "and the eviction reports")
    ap.add_argument("--evictions-ab", action="store_true",
                    help="both arms as `llumnix serve` runs them, 'off' without the eviction reports")
    ap.add_argument("--out", default=None,
                    help="default: benchmarks/results/prefix_affinity[_serve|_evictions].json")
    args = ap.parse_args()
    if args.out is None:
        suffix = "_evictions" if args.evictions_ab else "_serve" if args.serve_defaults else ""
        args.out = f"benchmarks/results/prefix_affinity{suffix}.json"

    tok = load_tokenizer("smollm2")
    rng = random.Random(args.seed)
    docs = [document(rng, tok, args.doc_tokens) for _ in range(args.conversations)]
    runs = []
    for k in range(args.rounds):
        for prefix in ((False, True) if k % 2 == 0 else (True, False)):
            run = run_once(prefix, args, docs, tok, len(runs))
            s = run["later_turns"]
            print(f"{'eviction reports' if args.evictions_ab else 'prefix affinity'} {'on ' if prefix else 'off'}: "
                  f"turns 2+: TTFT mean {s['ttft_mean_s']:.3f} s, "
                  f"P50 {s['ttft_p50_s']:.3f} s, max {s['ttft_max_s']:.3f} s; cached "
                  f"{100 * s['cached_fraction']:.1f}% of prompt tokens; wall {run['wall_s']} s; "
                  f"prefix blocks forgotten {run['prefix_blocks_forgotten']}", flush=True)
            runs.append(run)

    def pooled(prefix: bool) -> dict[str, float]:
        later = [r for run in runs if run["prefix_affinity"] == prefix for r in run["rows"] if r["turn"] > 0]
        return {"ttft_mean_s": round(statistics.mean(r["ttft_s"] for r in later), 4),
                "ttft_p50_s": round(statistics.median(r["ttft_s"] for r in later), 4),
                "e2e_mean_s": round(statistics.mean(r["e2e_s"] for r in later), 4),
                "cached_fraction": round(sum(r["cached_tokens"] for r in later)
                                         / sum(r["prompt_tokens"] for r in later), 4),
                "wall_s_mean": round(statistics.mean(run["wall_s"] for run in runs
                                                     if run["prefix_affinity"] == prefix), 2)}

    off, on = pooled(False), pooled(True)
    arms = ("prefix affinity as `llumnix serve` runs it (slack ratio 2, selection freed) without (off) "
            "or with (on) the index forgetting what the engines report evicted" if args.evictions_ab else
            "freeness (off) or with prefix affinity (on" + (", with serve's slack ratio 2, selection freed and "
                                                           "the eviction reports" if args.serve_defaults else "")
            + ")")
    result = {"what": "multi-turn chats (each turn's prompt is the conversation so far) on a 2-instance "
                      f"SmolLM2 cluster with prefix caching, dispatched by {arms}; figures over turns 2+, "
                      "pooled over the runs",
              "settings": vars(args), "machine": machine_info(), "off": off, "on": on,
              "ttft_mean_ratio_off_over_on": round(off["ttft_mean_s"] / on["ttft_mean_s"], 2),
              "ttft_p50_ratio_off_over_on": round(off["ttft_p50_s"] / on["ttft_p50_s"], 2),
              "runs": runs}
    write_result(args.out, result, quiet=True)
    print(f"turns 2+, pooled: TTFT mean {off['ttft_mean_s']:.3f} s -> {on['ttft_mean_s']:.3f} s "
          f"({result['ttft_mean_ratio_off_over_on']}x), P50 {off['ttft_p50_s']:.3f} s -> {on['ttft_p50_s']:.3f} s "
          f"({result['ttft_p50_ratio_off_over_on']}x); cached {100 * off['cached_fraction']:.1f}% -> "
          f"{100 * on['cached_fraction']:.1f}% of prompt tokens; {args.out}")


if __name__ == "__main__":
    main()
