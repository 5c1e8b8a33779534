"""Decode steps replayed from CUDA graphs.

A decode step of a small model on a GPU is bound by the host: some 25 kernel launches
a layer, each issued from Python and each a few microseconds of GPU work. SmolLM2's
step took 13-16 ms on an H100 at any batch size (benchmarks/gpu/README.md). A graph
records the step's kernels once per shape; a replay launches them all in one call.

Shapes are bucketed. A decode step of ``b`` requests whose longest context spans ``n``
blocks runs as the graph of the smallest batch bucket ``B >= b`` and block bucket
``N >= n``. The graph's inputs live in one static int64 buffer, refilled before each
replay by one host-to-device copy::

    [ ids (B) | positions (B) | slots (B) | context lengths (B) | block tables (B x N) ]

A padding row reads and writes only a scratch block kept beyond the pool, so no slot of
a real request is touched and its logits are dropped::

    cache storage, per layer and K/V:  [ block 0 | block 1 | ... | block M-1 | scratch ]
                                         \\________ the pool the engine sees ________/

Keys beyond a request's context are masked (``key < context length``), so a bucket's
extra blocks change nothing but the rounding of a longer reduction.

All graphs are recorded when the executor starts (as vLLM does), so no recording ever
overlaps a migration's copies on other threads. Steps with a prefill, prompt logprobs, or
more context than ``GraphShapes.max_gather_bytes`` allows run eagerly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llumnix.core.batch import ScheduledRequest
from llumnix.model.llama import AttnGroup, ForwardBatch, LlamaModel


@dataclass(frozen=True)
class GraphShapes:
    max_batch: int
    """Most requests in a step (the scheduler's ``max_num_seqs``)."""
    max_len: int
    """Longest context in tokens (the engine's ``max_model_len``)."""
    max_gather_bytes: int = 2**29
    """Most bytes of K and V one layer of a graph gathers (batch x context tokens x the
    model's K/V bytes per token); a larger step runs eagerly: its launches are a small
    part of its time, and the graphs' pool would hold its buffers for good."""


def powers_up_to(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, then ``n`` itself."""
    out = [1]
    while out[-1] * 2 < n:
        out.append(out[-1] * 2)
    return out if out[-1] == n else [*out, n]


class _Graph:
    """One recorded decode step of ``batch`` rows over ``blocks`` blocks of context."""

    def __init__(self, batch: int, blocks: int, device: torch.device) -> None:
        self.batch, self.blocks = batch, blocks
        size = batch * (4 + blocks)
        self.inputs = torch.zeros(size, dtype=torch.long, device=device)
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=device.type == "cuda")
        # marks the copy out of ``host``; a never-recorded event is already complete
        self.copied = torch.cuda.Event() if device.type == "cuda" else None  # type: ignore[no-untyped-call]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class DecodeGraphs:
    """Bucketed decode steps of one model over one cache. ``record=False`` runs the same
    padded step eagerly instead of replaying it (tests of the padding on a CPU)."""

    def __init__(self, model: LlamaModel, storage: torch.Tensor, block_size: int, shapes: GraphShapes,
                 record: bool = True) -> None:
        self.model = model
        self.storage = storage  # [layers, 2, pool blocks + 1, block, kv_heads, head_dim]
        self.block_size = block_size
        self.scratch = storage.shape[2] - 1
        self.record = record
        max_blocks = -(-shapes.max_len // block_size)
        per_token = 2 * storage[0, 0, 0, 0].numel() * storage.element_size()  # K and V, one layer
        max_tokens = shapes.max_gather_bytes // per_token
        self.batches = powers_up_to(shapes.max_batch)
        self.block_buckets = powers_up_to(max_blocks)
        self._graphs = {(b, n): _Graph(b, n, storage.device) for b in self.batches for n in self.block_buckets
                        if b * n * block_size <= max_tokens}
        self._pool = torch.cuda.graph_pool_handle() if record else None
        self._key_pos = torch.arange(max_blocks * block_size, device=storage.device)
        self._rows = torch.arange(self.batches[-1], device=storage.device)
        self.record_s = 0.0
        self.num_steps = 0  # decode steps run through a bucket (replayed, or padded eagerly)
        if record:
            t0 = time.perf_counter()
            # Largest first: the shared pool grows to the largest graph's needs at once
            # and every smaller graph fits in it.
            for g in sorted(self._graphs.values(), key=lambda g: -g.batch * g.blocks):
                self._record(g)
            self.record_s = time.perf_counter() - t0

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def _bucket(self, reqs: list[ScheduledRequest]) -> _Graph | None:
        if any(len(r.token_ids) != 1 or not r.sample for r in reqs):
            return None  # a prefill or a chunk: eager
        n = -(-max(r.context_len for r in reqs) // self.block_size)
        b = next((x for x in self.batches if x >= len(reqs)), None)
        blocks = next((x for x in self.block_buckets if x >= n), None)
        return None if b is None or blocks is None else self._graphs.get((b, blocks))

    def try_forward(self, reqs: list[ScheduledRequest]) -> torch.Tensor | None:
        """Logits [len(reqs), vocab] of a decode step, or None if no graph covers it."""
        g = self._bucket(reqs)
        if g is None:
            return None
        if g.copied is not None:
            g.copied.synchronize()  # the last copy out of the pinned buffer is done
        self._fill(g, reqs)
        g.inputs.copy_(g.host, non_blocking=True)
        self.num_steps += 1
        if not self.record:
            return self._step(g)[:len(reqs)]
        assert g.graph is not None and g.logits is not None and g.copied is not None
        g.copied.record()
        g.graph.replay()
        return g.logits[:len(reqs)]

    def _fill(self, g: _Graph, reqs: list[ScheduledRequest]) -> None:
        bsz, blocks, bs = g.batch, g.blocks, self.block_size
        buf = g.host.numpy()
        ids, pos, slots, ctx = (buf[i * bsz:(i + 1) * bsz] for i in range(4))
        tables = buf[4 * bsz:].reshape(bsz, blocks)
        tables[:] = self.scratch  # padding rows, and past the end of a real row's table
        ids[:] = 0
        pos[:] = 0
        slots[:] = self.scratch * bs
        ctx[:] = 1
        for i, r in enumerate(reqs):
            p = r.context_len - 1
            table = r.block_ids[:blocks]
            ids[i] = r.token_ids[0]
            pos[i] = p
            slots[i] = table[p // bs] * bs + p % bs
            ctx[i] = r.context_len
            tables[i, :len(table)] = np.asarray(table, dtype=np.int64)

    def _step(self, g: _Graph) -> torch.Tensor:
        """The padded decode step over ``g``'s inputs (what a graph records)."""
        bsz, length = g.batch, g.blocks * self.block_size
        x = g.inputs
        ctx = x[3 * bsz:4 * bsz]
        mask = (self._key_pos[:length].view(1, -1) < ctx.view(-1, 1)).view(bsz, 1, 1, length)
        group = AttnGroup(rows=slice(0, bsz), block_tables=x[4 * bsz:].view(bsz, g.blocks), ctx_len=length,
                          mask=mask, tok_b=None, tok_i=None, q_len=1, fresh_causal=False)
        fb = ForwardBatch(input_ids=x[:bsz], positions=x[bsz:2 * bsz], slot_mapping=x[2 * bsz:3 * bsz],
                          last_idx=self._rows[:bsz], groups=[group])
        return self.model.forward(fb, self.storage)

    def _record(self, g: _Graph) -> None:
        self._fill(g, [])  # any valid input: every row a padding row
        g.inputs.copy_(g.host)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy library handles are made outside the graph
            self._step(g)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (a migration's copy) do not void a recording
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            g.logits = self._step(g)
        g.graph = graph

    def stats(self) -> dict[str, Any]:
        return {"graphs": self.num_graphs, "record_s": self.record_s, "steps": self.num_steps,
                "batch_buckets": self.batches, "block_buckets": self.block_buckets}
