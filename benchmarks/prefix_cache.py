"""Prefix caching on the real engine: requests that share a long system prompt.

One engine with the cache and one without, the same model and the same requests,
run alternately in one process (these machines are noisy: the ratio is what to
quote). Each request is a chat of the shared system prompt and a question of its
own, sent after the previous one finished, so a request's time to first token is
its prefill alone. The first request fills the cache; the rest read the system
prompt's blocks from it. Writes benchmarks/results/prefix_cache.json.

    .venv/bin/python benchmarks/prefix_cache.py [--model smollm2] [--system-tokens 1000] [--requests 6]
"""
from __future__ import annotations

import argparse
import statistics
import time

from llumnix.bench.machine import machine_info, peak_rss_bytes, write_result
from llumnix.core.sampling_params import SamplingParams
from llumnix.llm import LLM

QUESTIONS = ["What is the capital of France?", "Name a prime number.", "What colour is the sky?",
             "How many legs has a spider?", "What is water made of?", "Who wrote Hamlet?",
             "What is two plus two?", "Name a planet.", "What do bees make?", "Which ocean is largest?"]


def system_prompt(llm: LLM, num_tokens: int) -> str:
    """A system prompt of about ``num_tokens`` tokens (numbered rules)."""
    rules, text = [], ""
    while len(llm.tokenizer.encode(text)) < num_tokens:
        rules.append(f"Rule {len(rules) + 1}: answer in one short sentence and never mention rule "
                     f"{len(rules) + 2}.")
        text = "You are a helpful assistant. " + " ".join(rules)
    return text


def prompt_ids(llm: LLM, system: str, question: str) -> list[int]:
    text = llm.tokenizer.apply_chat_template([{"role": "system", "content": system},
                                              {"role": "user", "content": question}])
    return llm.tokenizer.encode(text, add_special_tokens=False)


def ttft(llm: LLM, rid: str, ids: list[int], max_tokens: int) -> tuple[float, list[int], int]:
    """Seconds from submission to the first token, the output, and the cached prompt tokens."""
    llm.engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens))
    start, first, tokens, cached = time.perf_counter(), None, [], 0
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            if first is None:
                first = time.perf_counter() - start
            tokens += out.new_token_ids
            if out.metrics is not None:
                cached = out.metrics.num_cached_tokens
    assert first is not None
    return first, tokens, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=6, help="requests per engine (the first fills the cache)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/prefix_cache.json")
    args = ap.parse_args()

    engines = {on: LLM(args.model, enable_prefix_caching=on) for on in (False, True)}
    system = system_prompt(engines[True], args.system_tokens)
    prompts = [prompt_ids(engines[True], system, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.requests)]
    for llm in engines.values():  # warm-up on an unrelated prompt (allocator, kernels)
        ttft(llm, "warm-up", prompt_ids(llm, "Be brief.", "Hi"), 2)
    rows = []
    for i, ids in enumerate(prompts):
        row: dict[str, object] = {"request": i, "prompt_tokens": len(ids)}
        outs = {}
        for on in (False, True):
            t, toks, cached = ttft(engines[on], f"q{i}", ids, args.max_tokens)
            key = "cache" if on else "no_cache"
            row[f"ttft_s_{key}"] = round(t, 4)
            row[f"cached_tokens_{key}"] = cached
            outs[on] = toks
        row["same_tokens"] = outs[False] == outs[True]
        rows.append(row)
        print(row, flush=True)
    later = rows[1:]
    result = {
        "what": "time to first token of chat requests sharing a system prompt, one at a time, "
                "with and without prefix caching (the first request fills the cache)",
        "model": args.model, "system_prompt_tokens": len(engines[True].tokenizer.encode(system)),
        "max_tokens": args.max_tokens, "machine": machine_info(), "peak_rss_bytes": peak_rss_bytes(),
        "rows": rows,
        "median_ttft_s_no_cache": statistics.median(float(r["ttft_s_no_cache"]) for r in later),  # type: ignore[arg-type]
        "median_ttft_s_cache": statistics.median(float(r["ttft_s_cache"]) for r in later),  # type: ignore[arg-type]
        "all_outputs_equal": all(r["same_tokens"] for r in rows),
    }
    result["speedup_median"] = round(result["median_ttft_s_no_cache"] / result["median_ttft_s_cache"], 2)
    write_result(args.out, result, quiet=True)
    print(f"median TTFT after the first request: {result['median_ttft_s_no_cache']:.3f} s without the cache, "
          f"{result['median_ttft_s_cache']:.3f} s with it ({result['speedup_median']}x); "
          f"outputs equal: {result['all_outputs_equal']}; {args.out}")


if __name__ == "__main__":
    main()
