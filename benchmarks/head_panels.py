"""The CPU output projection as one matmul against column panels (model/llama.py, HEAD_PANEL).

    .venv/bin/python benchmarks/head_panels.py    # -> benchmarks/results/head_panels.json

Two measurements, side by side in one process, one torch thread (as an instance runs):
1. the head alone, SmolLM2's [576, 49152] in float32, for 1 to 64 rows (one row per
   request of a step), as one matmul and panel by panel;
2. whole decode steps of the real SmolLM2 engine at batch 1, 4 and 8 (prompts of
   100-300 tokens), the same model switched between the two layouts, rounds alternating.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from llumnix.bench.machine import machine_info, write_result
from llumnix.bench.profile import abort_all, synthetic_prompt
from llumnix.core.sampling_params import SamplingParams
from llumnix.llm import LLM
from llumnix.model import llama

ROWS = (1, 2, 4, 8, 16, 64)
BATCHES = (1, 4, 8)


def _ms(fn, n: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def to_panels(w: torch.Tensor) -> torch.Tensor:
    """[hidden, vocab] -> [n, hidden, HEAD_PANEL], the last panel zero-padded (model/llama.py's layout)."""
    hidden, vocab = w.shape
    n = -(-vocab // llama.HEAD_PANEL)
    panels = w.new_zeros(n, hidden, llama.HEAD_PANEL)
    for i in range(n):
        cols = w[:, i * llama.HEAD_PANEL:(i + 1) * llama.HEAD_PANEL]
        panels[i, :, :cols.shape[1]] = cols
    return panels


def head_alone() -> list[dict[str, float]]:
    hidden, vocab = 576, 49152
    w = torch.randn(hidden, vocab)
    panels = to_panels(w)
    out = []
    for m in ROWS:
        x = torch.randn(m, hidden)
        one = _ms(lambda x=x: x @ w, 15)
        pan = _ms(lambda x=x: torch.cat([x @ p for p in panels], dim=1)[:, :vocab], 15)
        out.append({"rows": m, "one_matmul_ms": one, "panels_ms": pan, "speedup": one / pan})
        print(f"head, {m:>2} rows: one matmul {one:6.1f} ms, panels {pan:6.1f} ms ({one / pan:.2f}x)", flush=True)
    return out


def decode_steps(rounds: int = 3) -> list[dict[str, float]]:
    llm = LLM("smollm2", num_blocks=256)
    model, eng = llm.loaded.model, llm.engine
    panelled = (None, model._panels)
    plain = (model.lm_head.contiguous(), None)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    out = []
    for b in BATCHES:
        res: dict[str, list[float]] = {"one_matmul": [], "panels": []}
        for r in range(rounds):
            for name, (head, pans) in (("one_matmul", plain), ("panels", panelled))[::1 if r % 2 == 0 else -1]:
                model._head, model._panels = head, pans
                for i in range(b):
                    eng.add_request(f"d{b}-{r}-{name}-{i}", synthetic_prompt(100 + 200 * i // max(1, b - 1), i + 1, 49152), params)
                while any(q.num_output_tokens == 0 for q in eng.requests.values()):
                    eng.step()
                res[name].append(_ms(eng.step, 10))
                abort_all(eng)
        one, pan = statistics.median(res["one_matmul"]), statistics.median(res["panels"])
        out.append({"batch": b, "one_matmul_ms": one, "panels_ms": pan, "speedup": one / pan,
                    "rounds": res})
        print(f"decode step, batch {b}: one matmul {one:6.1f} ms, panels {pan:6.1f} ms ({one / pan:.2f}x)", flush=True)
    model._head, model._panels = panelled
    return out


def main() -> None:
    torch.set_num_threads(1)
    doc = {"benchmark": "head_panels", "panel_columns": llama.HEAD_PANEL, "threads": 1,
           "head_alone": head_alone(), "decode_steps": decode_steps(), "machine": machine_info()}
    write_result(Path(__file__).parent / "results" / "head_panels.json", doc)


if __name__ == "__main__":
    main()
