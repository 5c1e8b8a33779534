"""The engine's weight formats (issue 48) side by side on one machine, interleaved.

    kernels  one matmul per SmolLM2 shape and weight format, batch 1, 8 and 32
    rows     one layer's projections, int4 against bf16 per row count (auto's switch)
    step     one decode step of SmolLM2's shapes (random weights), batch 1, 8 and 32:
             matmuls vs attention vs the rest (Python), from torch's profiler
    ops      the same step's aten calls by op and input shapes (counts do not depend on
             the machine's load: compare two commits with PYTHONPATH=<their src>)
    engines  our engine per weight format (and HF transformers' generate with ``--hf``, and
             llama.cpp's batched decode with ``--llama-python``): decode tokens/s at batch
             1/8/32, prefill 512, and the ratios between them round by round
    quality  each fast format against fp32: greedy tokens on 64 prompts, perplexity (and
             llama.cpp's greedy tokens against our fp32 with ``--llama-python``)
    cputime  CPU time of one decode step per format and batch (1, 8, 32) at one thread:
             less moved by other processes than wall time; run it alternately under two
             commits' ``PYTHONPATH`` to compare them

A format may be given as ``FORMAT/HEAD``: that weight format with its output head packed
as HEAD instead of ``quant.HEAD_FORMAT``'s choice (``auto/int8``: auto with int8's head).

Every mode runs ``--rounds`` interleaved rounds (format A, B, C, A, B, C, ...) and reports
medians with min-max spreads, since other processes share the CPU. JSON goes to
``--out`` (default /tmp/llumnix-bench/engine_speed), outside the checkout.

    PYTHONPATH=src python benchmarks/engine_speed.py kernels --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from llumnix.bench.machine import machine_info, write_result
from llumnix.model.quant import WEIGHT_FORMATS, matmul, pack

BATCHES = (1, 8, 32)
SHAPES = {"qkv 576x960": (576, 960), "o 576x576": (576, 576), "k/v 576x192": (576, 192),
          "gate_up 576x3072": (576, 3072), "up 576x1536": (576, 1536), "down 1536x576": (1536, 576),
          "lm_head 576x49152": (576, 49152)}


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


CLOCK: Callable[[], float] = time.perf_counter
"""``_time``'s clock: wall time, or this process's CPU time with ``--clock cpu``."""


def _time(fn: Callable[[], Any], reps: int) -> float:
    fn()
    t0 = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - t0) / reps


def kernels(args: argparse.Namespace) -> dict[str, Any]:
    """Microseconds per matmul, per shape, batch and format."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    for name, (k, n) in SHAPES.items():
        w = torch.randn(k, n, generator=g) * 0.05
        packed = {f: pack(w, f) for f in args.formats}
        for m in BATCHES:
            x = torch.randn(m, k, generator=g)
            runs: dict[str, list[float]] = {f: [] for f in args.formats}
            reps = max(3, int(2e8 // (k * n * max(m, 4))))
            for _ in range(args.rounds):
                for f in args.formats:
                    runs[f].append(1e6 * _time(lambda f=f, x=x, packed=packed: matmul(x, packed[f]), reps))
            out[f"{name} batch {m}"] = {f: stats(v) for f, v in runs.items()}
            print(name, m, {f: round(statistics.median(v), 1) for f, v in runs.items()}, flush=True)
    return out


LAYER_SHAPES = ("qkv 576x960", "o 576x576", "gate_up 576x3072", "down 1536x576")


def rows(args: argparse.Namespace) -> dict[str, Any]:
    """Microseconds of one layer's four projections per row count, int4 kernel against
    bf16 dense (and fp32): where they cross is ``quant.DENSE_ROWS``, ``auto``'s switch."""
    g = torch.Generator().manual_seed(0)
    fmts = ("fp32", "bf16", "int4")
    packed = {name: {f: pack(torch.randn(*SHAPES[name], generator=g) * 0.05, f) for f in fmts}
              for name in LAYER_SHAPES}
    out: dict[str, Any] = {}
    for m in (1, 2, 4, 6, 8, 12, 16, 32):
        xs = {name: torch.randn(m, SHAPES[name][0], generator=g) for name in LAYER_SHAPES}
        runs: dict[str, list[float]] = {f: [] for f in fmts}
        for _ in range(args.rounds):
            for f in fmts:
                runs[f].append(1e6 * _time(lambda f=f, xs=xs: [matmul(xs[n], packed[n][f]) for n in LAYER_SHAPES],
                                           20))
        out[f"rows {m}"] = {f: stats(v) for f, v in runs.items()}
        print(f"rows {m}", {f: round(statistics.median(v), 1) for f, v in runs.items()}, flush=True)
    return out


@contextmanager
def _head_as(fmt: str) -> Iterator[str]:
    """``FORMAT/HEAD`` -> FORMAT, its head packed as HEAD while the block runs (the load)."""
    from llumnix.model import quant

    base, _, head = fmt.partition("/")
    if not head:  # also where quant has no HEAD_FORMAT (an older commit's src)
        yield base
        return
    saved = dict(quant.HEAD_FORMAT)
    quant.HEAD_FORMAT[base] = head
    try:
        yield base
    finally:
        quant.HEAD_FORMAT.update(saved)


def _llm(fmt: str, **kw: Any) -> Any:
    from llumnix.llm import LLM

    with _head_as(fmt) as base:
        return LLM(args_model, weight_format=base, kv_cache_bytes=256 * 2**20, max_num_batched_tokens=4096, **kw)


SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_layers": 30,
           "num_heads": 9, "num_kv_heads": 3, "head_dim": 64}


def _random_model(fmt: str) -> Any:
    """SmolLM2-135M's shapes with random weights: a step's time does not depend on their
    values, and it runs where the GGUF is not (a machine the model cannot travel to)."""
    from llumnix.model.config import LlamaConfig
    from llumnix.model.llama import LayerWeights, LlamaModel

    cfg = LlamaConfig(**SMOLLM2)
    g = torch.Generator().manual_seed(0)
    h, i, qkv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05
    layers = [LayerWeights(torch.ones(h), r(h, qkv), r(cfg.q_size, h), torch.ones(h), r(h, 2 * i), r(i, h))
              for _ in range(cfg.num_layers)]
    model = LlamaModel(cfg, r(h, cfg.vocab_size), layers, torch.ones(h))
    with _head_as(fmt) as base:
        model.pack_weights(base)
    return model


def _decode_batch(executor: Any, batch: int, context: int) -> Any:
    """The ForwardBatch of one decode step: ``batch`` requests, each ``context`` tokens long."""
    from types import SimpleNamespace

    bs = executor.block_size
    per = -(-context // bs)
    reqs = [SimpleNamespace(token_ids=[100 + b], start_pos=context - 1, context_len=context, sample=True,
                            block_ids=list(range(b * per, (b + 1) * per))) for b in range(batch)]
    return executor._build(SimpleNamespace(scheduled=reqs))


def step(args: argparse.Namespace) -> dict[str, Any]:
    """One decode step (context 256) of SmolLM2's shapes per format and batch, interleaved:
    wall ms, and per step the profiler's self CPU time by category; wall minus ops is the
    Python and dispatch around them."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from llumnix.model.executor import ModelExecutor

    models = {f: _random_model(f) for f in args.formats}
    execs = {f: ModelExecutor(m, num_blocks=32 * 16 + 1, block_size=16) for f, m in models.items()}
    walls: dict[str, list[float]] = {}
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for batch in BATCHES:
                for f, ex in execs.items():
                    fb = _decode_batch(ex, batch, 256)
                    walls.setdefault(f"{f} batch {batch}", []).append(
                        1e3 * _time(lambda ex=ex, fb=fb: ex.model.forward(fb, ex._storage).argmax(-1), args.steps))
        for batch in BATCHES:
            for f, ex in execs.items():
                fb = _decode_batch(ex, batch, 256)
                with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(args.steps):
                        ex.model.forward(fb, ex._storage).argmax(-1)
                cats: dict[str, float] = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
                calls = 0
                for e in prof.key_averages():
                    cats[_category(e.key)] += e.self_cpu_time_total / 1e3 / args.steps
                    calls += e.count
                key = f"{f} batch {batch}"
                wall = stats(walls[key])
                out[key] = {"step_ms": wall, "ops_ms_profiled": cats, "aten_calls": calls / args.steps,
                            "rest_ms": wall["median"] - sum(cats.values())}
                print(key, f"step {wall['median']:.2f} ms ({wall['min']:.2f}-{wall['max']:.2f})",
                      {k: round(v, 2) for k, v in cats.items()}, f"{calls / args.steps:.0f} aten calls",
                      flush=True)
    return out


def ops(args: argparse.Namespace) -> dict[str, Any]:
    """Aten calls of one decode step (context 256) per format and batch, by op name and
    input shapes: counts, bytes copied are what a change of path shows, whatever the load."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from llumnix.model.executor import ModelExecutor

    out: dict[str, Any] = {}
    with torch.inference_mode():
        for f in args.formats:
            ex = ModelExecutor(_random_model(f), num_blocks=32 * 16 + 1, block_size=16)
            for batch in BATCHES:
                fb = _decode_batch(ex, batch, 256)
                ex.model.forward(fb, ex._storage)
                with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    ex.model.forward(fb, ex._storage).argmax(-1)
                rows = {f"{e.key} {e.input_shapes}": {"calls": e.count, "self_us": e.self_cpu_time_total}
                        for e in prof.key_averages(group_by_input_shape=True)}
                out[f"{f} batch {batch}"] = dict(sorted(rows.items()))
                print(f"{f} batch {batch}: {sum(r['calls'] for r in rows.values())} aten calls", flush=True)
                for k, r in sorted(rows.items(), key=lambda kv: -kv[1]["self_us"]):
                    print(f"  {r['calls']:5d} {r['self_us'] / 1e3:8.2f} ms  {k}", flush=True)
    return out


def cputime(args: argparse.Namespace) -> dict[str, Any]:
    """CPU milliseconds of one decode step (context 256, random SmolLM2 weights) per
    format and batch, formats interleaved round by round. ``time.process_time`` counts
    this process's CPU only, so other processes on the machine move it far less than
    wall time (they still share its caches); at one thread it is the step's work."""
    from llumnix.model.executor import ModelExecutor

    execs = {f: ModelExecutor(_random_model(f), num_blocks=32 * 16 + 1, block_size=16) for f in args.formats}
    runs: dict[str, list[float]] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for batch in BATCHES:
                for f, ex in execs.items():
                    fb = _decode_batch(ex, batch, 256)
                    ex.model.forward(fb, ex._storage).argmax(-1)
                    t0 = time.process_time()
                    for _ in range(args.steps):
                        ex.model.forward(fb, ex._storage).argmax(-1)
                    runs.setdefault(f"{f} batch {batch}", []).append(1e3 * (time.process_time() - t0) / args.steps)
    out = {k: stats(v) for k, v in runs.items()}
    for k, v in out.items():
        print(f"{k}: {v['median']:.2f} ms CPU a step ({v['min']:.2f}-{v['max']:.2f})", flush=True)
    return out


def _category(op: str) -> str:
    if op in ("aten::mm", "aten::addmm") or "pack_mm" in op:
        return "matmul"
    if any(s in op for s in ("bmm", "softmax", "scaled_dot_product", "index_select", "index_copy",
                             "masked_fill", "_flash_attention")):
        return "attention"
    return "other ops"


def engines(args: argparse.Namespace) -> dict[str, Any]:
    """Our engine per format, HF transformers and llama.cpp (``--llama-python``) on the same
    GGUF and thread count, interleaved round by round: decode tokens/s at batch 1/8/32
    (context 256), prefill tokens/s of 512 tokens; ratios per round, then their medians."""
    from llumnix.bench.engine_bench import bench_decode, bench_prefill
    from llumnix.core.sampling_params import SamplingParams

    llms = {f: _llm(f) for f in args.formats}
    for llm in llms.values():
        llm.generate(["warm up"], SamplingParams(max_tokens=4))
    runs: dict[str, dict[str, list[float]]] = {f: {} for f in llms}
    hf = _Transformers() if args.hf else None
    for _ in range(args.rounds):
        for f, llm in llms.items():
            for b in BATCHES:
                runs[f].setdefault(f"decode_b{b}", []).append(bench_decode(llm, b, args.steps))
            runs[f].setdefault("prefill_512", []).append(bench_prefill(llm, 512, 1))
        if hf is not None:
            for k, v in hf.measure(args.steps).items():
                runs.setdefault("transformers", {}).setdefault(k, []).append(v)
        if args.llama_python:
            for k, v in _llama_cpp(args, {"mode": "speed", "batches": list(BATCHES), "steps": args.steps,
                                          "context": 256, "prefill": 512}).items():
                runs.setdefault("llama.cpp", {}).setdefault(k, []).append(v)
        print({f: {k: round(v[-1], 1) for k, v in r.items()} for f, r in runs.items()}, flush=True)
    out: dict[str, Any] = {f: {k: stats(v) for k, v in r.items()} for f, r in runs.items()}
    for other in ("fp32", "transformers", "llama.cpp"):
        if other in runs:
            out[f"ratio_to_{other}"] = {f: {k: stats([a / b for a, b in zip(v, runs[other][k], strict=True)])
                                            for k, v in runs[f].items() if k in runs[other]}
                                        for f in llms if f != other}
    if not args.llama_python:
        out["llama.cpp"] = "skipped: no --llama-python (a Python with llama-cpp-python installed)"
    return out



def _llama_cpp(args: argparse.Namespace, request: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's figures from ``engine_speed_llamacpp.py`` in its own process."""
    import json
    import subprocess

    from llumnix.model.loader import resolve_model_path

    request |= {"model": str(resolve_model_path(args_model)), "threads": args.threads}
    script = Path(__file__).with_name("engine_speed_llamacpp.py")
    done = subprocess.run([args.llama_python, str(script)], input=json.dumps(request), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp side failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class _Transformers:
    """HF transformers on the same GGUF (dequantized to float32 by transformers)."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM

        from llumnix.model.loader import resolve_model_path

        path = resolve_model_path(args_model)
        self.hf: Any = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32).eval()

    def _gen(self, ids: torch.Tensor, n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    def measure(self, steps: int) -> dict[str, float]:
        out = {}
        for batch in BATCHES:
            ids = torch.tensor([[100 + (i * 7919 + s * 104729) % 40000 for i in range(256)] for s in range(batch)])
            out[f"decode_b{batch}"] = batch * steps / (self._gen(ids, steps + 1) - self._gen(ids, 1))
        ids = torch.tensor([[100 + (i * 7919 + 7 * 104729) % 40000 for i in range(512)]])
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.hf(ids)
        out["prefill_512"] = 512 / (time.perf_counter() - t0)
        return out


PROMPT_SUBJECTS = ("the ocean", "a small town", "machine learning", "the moon", "coffee", "a library",
                   "winter", "the Roman empire", "bicycles", "a robot", "music", "the internet",
                   "volcanoes", "a chess game", "gardening", "the stock market")
PROMPT_FORMS = ("Write one sentence about {}.", "Here is a short story about {}:",
                "Three facts about {}:\n1.", "Q: What do you know about {}?\nA:")


def quality(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy agreement over 64 prompts (first 16 tokens identical) and perplexity of a
    held text (README.md), each fast format against fp32."""
    from llumnix.core.sampling_params import SamplingParams

    prompts = [f.format(s) for f in PROMPT_FORMS for s in PROMPT_SUBJECTS]
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    results: dict[str, Any] = {}
    ref_tokens: list[list[int]] = []
    ref_ppl = 0.0
    for fmt in ["fp32"] + [f for f in args.formats if f != "fp32"]:
        llm = _llm(fmt)
        tokens = [c.token_ids for c in llm.generate(prompts, greedy)]
        ids = llm.tokenizer.encode(text)[:1024]
        scored = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs
        assert scored is not None
        ppl = float(torch.tensor([-lp for _, lp, _ in scored]).mean().exp())
        if fmt == "fp32":
            ref_tokens, ref_ppl = tokens, ppl
        same = sum(a == b for a, b in zip(tokens, ref_tokens, strict=True))
        results[fmt] = {"prompts": len(prompts), "first16_identical": same,
                        "first16_identical_frac": same / len(prompts), "perplexity": ppl,
                        "perplexity_vs_fp32": ppl / ref_ppl - 1, "ppl_tokens": len(ids)}
        print(fmt, results[fmt], flush=True)
        if fmt == "fp32" and args.llama_python:
            ids_of = [llm.encode_prompt(p) for p in prompts]
            theirs = _llama_cpp(args, {"mode": "greedy", "prompts": ids_of, "tokens": 16})["tokens"]
            same = sum(a == b for a, b in zip(theirs, ref_tokens, strict=True))
            results["llama.cpp"] = {"prompts": len(prompts), "first16_identical": same,
                                    "first16_identical_frac": same / len(prompts),
                                    "note": "llama.cpp's own kernels on the file's Q4_1/Q8_0 weights"}
            print("llama.cpp", results["llama.cpp"], flush=True)
        del llm
    return results


MODES = {"kernels": kernels, "rows": rows, "step": step, "ops": ops, "engines": engines, "quality": quality,
         "cputime": cputime}
args_model = "smollm2"


def main() -> None:
    global args_model, CLOCK
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=MODES)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--formats", default=",".join(WEIGHT_FORMATS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per measurement")
    p.add_argument("--hf", action="store_true", help="engines: HF transformers' generate too")
    p.add_argument("--llama-python", default=None, metavar="PYTHON",
                   help="engines, quality: a Python with llama-cpp-python, for llama.cpp's figures")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="kernels, rows, step: time by the wall or by this process's CPU time")
    p.add_argument("--out", default="/tmp/llumnix-bench/engine_speed")
    args = p.parse_args()
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    args.formats = args.formats.split(",")
    args_model = args.model
    torch.set_num_threads(args.threads)
    result = {"benchmark": f"engine_speed {args.mode}", "machine": machine_info(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "result": MODES[args.mode](args)}
    write_result(Path(args.out) / f"{args.mode}.json", result)


if __name__ == "__main__":
    main()
