"""Frozen configuration of the engine core. Derived values are properties."""
from __future__ import annotations

from dataclasses import dataclass

from llumnix.core.errors import InvalidRequestError


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV block."""
    num_blocks: int | None = None
    """Blocks in the pool; None sizes the pool from kv_cache_bytes."""
    kv_cache_bytes: int = 512 * 2**20
    """Bytes of KV cache when num_blocks is not given."""
    watermark: float = 0.01
    """Fraction of the pool an admission (or an incoming migration) must leave free."""
    enable_prefix_caching: bool = False
    """Share the KV of full blocks between requests whose sequences start alike, and keep
    released blocks findable until their space is needed (``kv/prefix_cache.py``)."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InvalidRequestError("block_size must be >= 1", "block_size")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InvalidRequestError("num_blocks must be >= 1", "num_blocks")
        if not 0.0 <= self.watermark < 1.0:
            raise InvalidRequestError("watermark must be in [0, 1)", "watermark")

    def resolve_num_blocks(self, bytes_per_block: int) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        return max(1, self.kv_cache_bytes // bytes_per_block)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    """Most requests in one batch (the paper's B in the freeness formula)."""
    max_num_batched_tokens: int = 4096
    """Most tokens one step computes (without chunked prefill: one prefill step; a lone
    request longer than this is still prefilled whole)."""
    chunked_prefill: bool = False
    """Chunked prefill (Sarathi-Serve; vLLM's default since V1): every step serves the
    running requests' decodes first, then prefills within what is left of
    ``max_num_batched_tokens``, splitting a long prompt over several steps, so a long
    prompt no longer stalls every decode of its instance for its whole prefill. Off: the
    paper's engine (vLLM 0.1.x), whose step is a prefill batch or a decode batch."""
    preemption_mode: str = "recompute"
    """Only recompute is implemented: the evicted request's KV is dropped and re-prefilled."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise InvalidRequestError("max_num_seqs must be >= 1", "max_num_seqs")
        if self.max_num_batched_tokens < 1:
            raise InvalidRequestError("max_num_batched_tokens must be >= 1", "max_num_batched_tokens")
        if self.chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidRequestError(
                f"with chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_num_seqs ({self.max_num_seqs}): every running request's decode fits one step",
                "max_num_batched_tokens")
        if self.preemption_mode != "recompute":
            raise InvalidRequestError("preemption_mode must be 'recompute'", "preemption_mode")


@dataclass(frozen=True)
class EngineConfig:
    cache: CacheConfig = CacheConfig()
    """KV cache layout and size."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """Batching limits."""
    max_model_len: int = 2048
    """Longest sequence (prompt + output) the model accepts."""
