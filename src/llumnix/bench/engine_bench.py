"""`llumnix bench engine`: prefill and decode throughput of one engine, against
Hugging Face transformers on the same weights, and the engine's memory.

Every figure is measured in this one run, side by side, on this machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llumnix.bench.machine import machine_info, peak_rss_bytes, write_result
from llumnix.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llumnix.llm import LLM

PREFILL_LENS = (128, 512, 2048)
DECODE_BATCHES = (1, 8, 32)
CONTEXT = 256
DECODE_STEPS = 32


def _prompt(n: int, salt: int = 0) -> list[int]:
    # Ordinary-vocabulary ids, varied so no two prompts are identical.
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]


def bench_prefill(llm: LLM, n: int, reps: int) -> float:
    times = []
    for r in range(reps):
        llm.engine.add_request(f"p{n}-{r}", _prompt(n, r), SamplingParams(max_tokens=1))
        t0 = time.perf_counter()
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
        times.append(time.perf_counter() - t0)
    return n / min(times)


def bench_decode(llm: LLM, batch: int, steps: int) -> float:
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        llm.engine.add_request(f"d{batch}-{i}", _prompt(CONTEXT, i), params)
    while any(r.num_output_tokens == 0 for r in llm.engine.requests.values()):
        llm.engine.step()  # prefill everyone first
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    elapsed = time.perf_counter() - t0
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return batch * steps / elapsed


def bench_transformers(model_path: str, steps: int, reps: int, dtype: str,
                       device: str = "cpu") -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    where = {"pretrained_model_name_or_path": str(path)} if path.is_dir() else \
        {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    hf: Any = AutoModelForCausalLM.from_pretrained(**where, dtype=getattr(torch, dtype))
    hf.to(device).eval()
    ids = torch.tensor([_prompt(CONTEXT)], device=device)

    def gen(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                        do_sample=False, pad_token_id=0)
        _sync(device)
        return time.perf_counter() - t0

    gen(2)  # warm-up
    t_long = min(gen(steps + 1) for _ in range(reps))
    t_one = min(gen(1) for _ in range(reps))
    return {"decode_tokens_per_s_batch1": steps / (t_long - t_one),
            "prefill_s_256": t_one}


def _sync(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (a no-op on the CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measure_memory(model: str, kv_bytes: int) -> dict[str, float]:
    """Resident memory of a fresh process holding one engine, every KV page touched:
    now (steady state, after serving a batch) and at its peak (model loading included)."""
    code = f"""
import json, torch
torch.set_num_threads(1)
from llumnix.llm import LLM
from llumnix.bench.machine import peak_rss_bytes, current_rss_bytes
from llumnix.core.sampling_params import SamplingParams
llm = LLM({model!r}, kv_cache_bytes={kv_bytes})
ex = llm.executor
ex.kv_cache.fill_(1.0)  # make every page of the pool resident
llm.generate(["Hello there"] * 8, SamplingParams(max_tokens=16))
n = llm.engine.kv.num_total_blocks
print(json.dumps({{"rss_bytes": current_rss_bytes(), "peak_rss_bytes": peak_rss_bytes(),
                   "num_blocks": n, "kv_pool_bytes": n * ex.bytes_per_block}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main_engine_bench(args: argparse.Namespace) -> int:
    import torch

    from llumnix.llm import LLM
    from llumnix.model.loader import resolve_model_path

    resolve_model_path(args.model)  # a one-line error here, not a failed child process below
    torch.set_num_threads(args.threads or 1)
    # First, while this process is small: Linux carries a parent's peak RSS into a
    # forked child's ru_maxrss, so measuring after loading models here would inflate it.
    # A CPU engine's figure: a GPU run reports the GPU memory instead.
    on_cuda = str(args.device).startswith("cuda")
    memory = None if on_cuda else measure_memory(args.model, 512 * 2**20)
    reps = 1 if args.quick else 3
    steps = 8 if args.quick else DECODE_STEPS
    t0 = time.perf_counter()
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_num_batched_tokens=4096,
              cuda_graphs=args.cuda_graphs)
    start_s = time.perf_counter() - t0
    llm.generate(["warm up"], SamplingParams(max_tokens=4))
    result: dict[str, object] = {
        "benchmark": "engine", "model": llm.loaded.name, "device": args.device, "dtype": args.dtype,
        "machine": machine_info(), "settings": {"context": CONTEXT, "decode_steps": steps,
                                                "reps": reps, "block_size": 16,
                                                "torch_threads": torch.get_num_threads()},
        "engine_start_s": start_s,
    }
    result["prefill_tokens_per_s"] = {str(n): bench_prefill(llm, n, reps) for n in PREFILL_LENS}
    result["decode_tokens_per_s"] = {str(b): bench_decode(llm, b, steps) for b in DECODE_BATCHES}
    dec = result["decode_tokens_per_s"]
    assert isinstance(dec, dict)
    result["batch32_over_batch1"] = dec["32"] / dec["1"]
    graphs = llm.executor.graphs
    result["cuda_graphs"] = None if graphs is None else graphs.stats()
    result["rss_after_bench_bytes"] = peak_rss_bytes()
    if on_cuda:  # weights, KV pool, activations and graphs on the GPU
        result["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    model_path = str(llm.loaded.path)
    del llm
    if not args.no_reference:
        hf = bench_transformers(model_path, steps, reps, args.dtype, args.device)
        result["transformers"] = hf
        result["batch1_over_transformers"] = dec["1"] / hf["decode_tokens_per_s_batch1"]
    if memory is not None:
        result["memory_512mib_pool"] = memory
    _print(result)
    write_result(Path(args.out) / "engine.json", result)
    return 0


def _print(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"engine benchmark: {r['model']} on {r['device']} ({r['dtype']})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for n, v in r["prefill_tokens_per_s"].items():
        t.add_row(f"prefill tokens/s, {n} tokens", f"{v:,.0f}")
    for b, v in r["decode_tokens_per_s"].items():
        t.add_row(f"decode tokens/s, batch {b}, context ~{CONTEXT}", f"{v:,.1f}")
    t.add_row("batch 32 / batch 1", f"{r['batch32_over_batch1']:.2f}x")
    g = r.get("cuda_graphs")
    t.add_row("CUDA graphs", "off" if g is None else
              f"{g['graphs']} recorded in {g['record_s']:.1f} s, {g['steps']} decode steps replayed")
    if "transformers" in r:
        t.add_row("transformers generate, batch 1 tokens/s",
                  f"{r['transformers']['decode_tokens_per_s_batch1']:,.1f}")
        t.add_row("ours / transformers, batch 1", f"{r['batch1_over_transformers']:.2f}x")
    if "cuda_max_allocated_bytes" in r:
        t.add_row("GPU memory allocated at most", f"{r['cuda_max_allocated_bytes'] / 1e9:.2f} GB")
    if "memory_512mib_pool" in r:
        m = r["memory_512mib_pool"]
        t.add_row("RSS of a CPU engine, fp32 + 512 MiB KV pool (steady / peak)",
                  f"{m['rss_bytes'] / 1e9:.2f} / {m['peak_rss_bytes'] / 1e9:.2f} GB")
    Console().print(t)
