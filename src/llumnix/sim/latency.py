"""Latency models: how long a step takes, and what a migration stage costs.

A model answers three questions the simulator asks: the latency of a prefill
batch (by the tokens of each sequence in it), the latency of a decode step (by
batch size and the context tokens in the batch), and the cost of moving KV
blocks between instances (``MigrationCost``).

The preset ``a10-llama7b`` is fitted with least squares to the paper's A10 +
LLaMA-7B anchors (sim/calibration.py); ``calibration_report`` in
sim/calibration_report.py states its error on every anchor. Those anchors time the
model's steps alone; ``a10-llama7b-serving`` adds the serving engine's own work per
step (``SERVING_STEP_OVERHEAD_S``, fitted to the paper's single-instance load
measurements), the model for the paper's serving experiments. A profile measured on
our own engine loads through sim/profile.py.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from llumnix.sim import calibration as cal


@dataclass(frozen=True)
class MigrationCost:
    """Cost of migration stages: a handshake plus the copy of the stage's blocks.

    The last stage (the only one with the request paused) also pays a commit cost
    that grows with the request's size: the destination installs the request and
    its block table, the source frees its copy. Downtime = the last stage.
    """

    bytes_per_block: int
    """KV bytes of one block (all layers, K and V)."""
    bandwidth: float
    """Bytes per second of a fused copy (the stage's blocks in one contiguous buffer)."""
    stage_overhead_s: float = 0.001
    """Fixed cost of one stage: the reservation round trip and the copy launch."""
    last_stage_overhead_s: float | None = None
    """Fixed cost of the last stage, if it differs (None: ``stage_overhead_s``). A real
    last stage runs at one step boundary into blocks reserved ahead, so it skips the
    reservation round trip and the boundary waits a pre-copy stage pays."""
    commit_knots_blocks: tuple[float, ...] = (0.0,)
    """Request sizes (blocks) at which the commit cost is known; linear in between, flat outside."""
    commit_knots_s: tuple[float, ...] = (0.0,)
    """Commit cost (seconds) at each knot."""
    blocking_bandwidth: float | None = None
    """Bytes per second of the unfused copy of a blocking (one-stage) migration; None: ``bandwidth``."""
    decode_slowdown: float = 1.0
    """Factor on the decode steps of an instance while it copies KV for a migration."""

    def copy_time(self, num_blocks: int, *, blocking: bool = False) -> float:
        bw = self.blocking_bandwidth if blocking and self.blocking_bandwidth else self.bandwidth
        return num_blocks * self.bytes_per_block / bw

    def commit_time(self, num_request_blocks: int) -> float:
        return float(np.interp(num_request_blocks, self.commit_knots_blocks, self.commit_knots_s))

    def stage_time(self, num_blocks: int, *, is_last: bool, num_request_blocks: int,
                   blocking: bool = False) -> float:
        fixed = self.stage_overhead_s
        if is_last and self.last_stage_overhead_s is not None:
            fixed = self.last_stage_overhead_s
        t = fixed + self.copy_time(num_blocks, blocking=blocking)
        if is_last:
            t += self.commit_time(num_request_blocks)
        return t


@dataclass(frozen=True)
class NeighborContention:
    """Step-time factors while another instance on the same host is mid-step.

    Instances that share a host's cores and memory bandwidth slow each other down: on
    the 2-core CPU machine the fidelity benchmark runs on, a SmolLM2 decode step (memory
    bound: it streams the weights) takes ~15-20% longer while the other instance steps,
    a prefill (compute bound) hardly longer. ``llumnix profile`` measures both factors
    with one neighbor; they apply when at least one other instance is stepping when a
    step starts. 1.0 (the default, and the A10 preset's): instances do not share."""

    prefill: float = 1.0
    decode: float = 1.0

    @property
    def is_neutral(self) -> bool:
        return self.prefill == 1.0 and self.decode == 1.0


NO_CONTENTION = NeighborContention()


class LatencyModel(Protocol):
    """What the simulated executor asks of a latency model (seconds)."""

    @property
    def migration(self) -> MigrationCost: ...

    @property
    def contention(self) -> NeighborContention: ...

    @property
    def step_overhead_s(self) -> float:
        """Seconds the serving loop spends on every step besides the model's step time
        (scheduling, sampling, output hand-off); the executor adds it to each step."""
        ...

    @property
    def seq_overhead_s(self) -> float:
        """Seconds of serving work per sequence in a step's batch (per-sequence sampling,
        detokenizing and block-table work); the executor adds it times the batch size."""
        ...

    def prefill_time(self, seq_lens: Sequence[int]) -> float: ...

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float: ...


@dataclass(frozen=True)
class ParametricLatencyModel:
    """prefill = p0 + p1 * sum(len) + p2 * sum(len^2)   (linear layers + attention)
    decode  = d0 + d1 * batch + d2 * sum(context)      (weights read + per-sequence + KV read)
    """

    prefill_fixed_s: float
    prefill_per_token_s: float
    prefill_per_token2_s: float
    decode_fixed_s: float
    decode_per_seq_s: float
    decode_per_context_token_s: float
    migration: MigrationCost
    contention: NeighborContention = NO_CONTENTION
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0

    def prefill_time(self, seq_lens: Sequence[int]) -> float:
        return (self.prefill_fixed_s + self.prefill_per_token_s * sum(seq_lens)
                + self.prefill_per_token2_s * sum(n * n for n in seq_lens))

    def decode_time(self, batch_size: int, num_context_tokens: int) -> float:
        return (self.decode_fixed_s + self.decode_per_seq_s * batch_size
                + self.decode_per_context_token_s * num_context_tokens)


def _relative_lstsq(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares on relative error, so short and long anchors weigh the same."""
    coef: np.ndarray = np.linalg.lstsq(design / target[:, None], np.ones_like(target), rcond=None)[0]
    return coef


def fit_prefill(seq_lens: Sequence[int], latency_ms: Sequence[float]) -> tuple[float, float, float]:
    n = np.asarray(seq_lens, dtype=float)
    c = _relative_lstsq(np.stack([np.ones_like(n), n, n * n], 1), np.asarray(latency_ms))
    return float(c[0]) / 1e3, float(c[1]) / 1e3, float(c[2]) / 1e3


def fit_decode(batch_sizes: Sequence[float], context_tokens: Sequence[float], latency_ms: Sequence[float],
               prior: tuple[float, float, float] | None = None) -> tuple[float, float, float]:
    """Fit d0 + d1*batch + d2*context. ``prior`` = (batch, context, ms), one more anchor
    that separates the fixed cost from the context cost when the anchors cannot."""
    b, ctx, y = (np.asarray(v, dtype=float) for v in (batch_sizes, context_tokens, latency_ms))
    if prior is not None:
        b, ctx, y = np.append(b, prior[0]), np.append(ctx, prior[1]), np.append(y, prior[2])
    c = _relative_lstsq(np.stack([np.ones_like(b), b, ctx], 1), y)
    return float(c[0]) / 1e3, float(c[1]) / 1e3, float(c[2]) / 1e3


def fit_a10_migration(stage_overhead_s: float = 0.001) -> MigrationCost:
    """Migration costs from Figure 10's downtime rows.

    Llumnix's last stage sends about one block (the partially filled one), so its
    downtime minus a handshake and one block's copy is the commit cost at that size.
    A blocking copy sends every block (the partial one included) in one stage; the
    slope of that row fixes the bandwidth of an unfused copy (about 2.5 GB/s, far below
    the 15 GB/s of the fused copy). The row is not quite linear, so the slope minimizes
    the largest relative error rather than the squared one.
    """
    blocks = np.asarray(cal.SEQ_LENS, dtype=float) / cal.BLOCK_SIZE
    one_block = cal.BYTES_PER_BLOCK / cal.MIGRATION_BANDWIDTH
    commit = np.asarray(cal.DOWNTIME_MS) / 1e3 - stage_overhead_s - one_block
    blocking = np.asarray(cal.BLOCKING_COPY_MS) / 1e3
    copied = (blocks + 1) * cal.BYTES_PER_BLOCK

    def worst(sec_per_byte: float) -> float:
        model = stage_overhead_s + commit + copied * sec_per_byte
        return float(np.max(np.abs(model / blocking - 1)))

    grid = np.linspace(0.5, 2.0, 3001) * float(np.median((blocking - commit) / copied))
    sec_per_byte = float(grid[np.argmin([worst(g) for g in grid])])
    slowdown = float(np.mean(np.asarray(cal.DECODE_MIGRATING_MS) / np.asarray(cal.DECODE_MS)))
    return MigrationCost(
        bytes_per_block=cal.BYTES_PER_BLOCK, bandwidth=cal.MIGRATION_BANDWIDTH,
        stage_overhead_s=stage_overhead_s,
        commit_knots_blocks=tuple(float(x) for x in blocks),
        commit_knots_s=tuple(float(x) for x in commit),
        blocking_bandwidth=1.0 / sec_per_byte, decode_slowdown=slowdown,
    )


def fit_a10_llama7b(step_overhead_s: float = 0.0) -> ParametricLatencyModel:
    p0, p1, p2 = fit_prefill(cal.SEQ_LENS, cal.PREFILL_MS)
    batch = [cal.DECODE_CONTEXT_TOKENS / n for n in cal.SEQ_LENS]
    ctx = [cal.DECODE_CONTEXT_TOKENS] * len(batch)
    d0, d1, d2 = fit_decode(batch, ctx, cal.DECODE_MS, prior=(1, 16, cal.NON_ATTENTION_BATCH1_MS))
    return ParametricLatencyModel(p0, p1, p2, d0, d1, d2, fit_a10_migration(), step_overhead_s=step_overhead_s)


def a10_llama7b_serving() -> ParametricLatencyModel:
    return fit_a10_llama7b(cal.SERVING_STEP_OVERHEAD_S)


DEFAULT_PRESET = "a10-llama7b-serving"
PRESETS = {"a10-llama7b": fit_a10_llama7b, "a10-llama7b-serving": a10_llama7b_serving}


def get_latency_model(name_or_path: str) -> LatencyModel:
    """A preset by name, or a profile JSON (sim/profile.py) by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]()
    from llumnix.sim.profile import load_profile

    return load_profile(name_or_path)


def interp_clamped(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the knots, extrapolated linearly past the last one
    along the last segment but never downward (latency does not shrink with load),
    clamped to the first value below the first."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i >= len(xs):
        x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
        return y1 + max(0.0, y1 - y0) * (x - x1) / (x1 - x0)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
