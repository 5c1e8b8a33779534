from __future__ import annotations

from llumnix.core.clock import VirtualClock
from llumnix.core.config import CacheConfig, EngineConfig, SchedulerConfig
from llumnix.engine import EngineCore
from tests.fakes import TokenCacheExecutor


def make_engine(num_blocks: int = 64, block_size: int = 4, *, max_num_seqs: int = 8,
                max_batched: int = 256, watermark: float = 0.0, max_model_len: int = 1024,
                eos: int | None = None, instance_id: str = "i0", detokenizer=None,
                vocab_size: int = 1000, prefix_caching: bool = False, chunked: bool = False) -> EngineCore:
    config = EngineConfig(
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks, watermark=watermark,
                          enable_prefix_caching=prefix_caching),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
                                  chunked_prefill=chunked),
        max_model_len=max_model_len,
    )
    executor = TokenCacheExecutor(num_blocks, block_size, vocab_size)
    return EngineCore(config, executor, num_blocks, clock=VirtualClock(), instance_id=instance_id,
                      eos_token_id=eos, detokenizer=detokenizer)


def run_to_completion(engine: EngineCore, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until idle; returns every request's output tokens and checks invariants each step."""
    tokens: dict[str, list[int]] = {}
    clock = engine.clock
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        engine.check_invariants()
        if isinstance(clock, VirtualClock):
            clock.advance_to(clock.now() + 0.01)
    raise AssertionError("engine did not drain")
