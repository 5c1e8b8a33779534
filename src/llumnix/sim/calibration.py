"""The published A10 + LLaMA-7B measurements the `a10-llama7b` latency preset is fitted to.

Source: /work/shared/calibration/README.md (the paper's Figure 10 and testbed section).
Times in milliseconds, lengths in tokens.
"""
from __future__ import annotations

SEQ_LENS = (256, 512, 1024, 2048, 4096, 8192)
"""Sequence lengths of Figure 10's columns."""

PREFILL_MS = (58.0, 110.0, 220.0, 436.0, 940.0, 1995.0)
"""Prefill of one sequence of that length."""

DECODE_MS = (52.0, 47.0, 44.3, 43.6, 43.3, 43.5)
"""Decode step of a batch of 8192/len sequences of that length (8k context tokens in the batch)."""

DECODE_MIGRATING_MS = (53.6, 47.8, 45.5, 44.7, 44.0, 44.5)
"""The same decode step while one request of the batch migrates out."""

DOWNTIME_MS = (12.0, 12.0, 15.0, 17.0, 23.0, 27.0)
"""Llumnix migration downtime of one request of that length."""

BLOCKING_COPY_MS = (69.0, 129.0, 227.0, 452.0, 910.0, 1683.0)
"""Downtime of a blocking copy of the request's whole KV cache."""

DECODE_CONTEXT_TOKENS = 8192
"""Context tokens in each decode anchor's batch."""

NON_ATTENTION_BATCH1_MS = 24.0 * 1.2
"""Vidur's non-attention compute of one token on an A40 (24.0 ms) scaled by the A40/A10 ratio
(about 1.2): the decode floor of a one-sequence batch with almost no context. The paper's
decode anchors all hold 8k context tokens, so they cannot separate the fixed cost from the
attention cost; this prior pins the fixed cost."""

BLOCK_SIZE = 16
BYTES_PER_BLOCK = 2 * 32 * 4096 * 2 * BLOCK_SIZE
"""K and V, 32 layers, hidden 4096, fp16: 0.5 MiB per token, 8 MiB per block."""

MIGRATION_BANDWIDTH = 15e9
"""Bytes per second of a fused (one contiguous buffer) KV copy between instances."""

SERVING_DECODE_BAND_S = (0.049, 0.066)
"""Mean per-token decode latency the paper observed in its serving runs."""

SERVING_STEP_OVERHEAD_S = 0.007
"""Seconds of serving work per engine step beyond Figure 10's step times (scheduling,
sampling, detokenizing, output hand-off), in the `a10-llama7b-serving` preset. Fitted
(benchmarks/sim/serving_overhead.py) to the paper's Figure 3, one real instance serving
M-M at 0.42 req/s: 62% KV memory in use, 8% of requests preempted, P99/P50 decode 3.8x.
Maximum likelihood of those single-run values: 7.0 ms (1 sigma 2-12 ms; relative least
squares 9 ms); without it the simulated instance is lighter on all three (55%, 4.3%,
2.9x over 20 seeds). The size agrees with vLLM's own measurements of its per-step CPU
work (sampler, scheduling, detokenizing: about 10% of a step in 2023; 4-13 ms of GPU
idle per decode step in 2024)."""
