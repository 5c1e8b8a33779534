"""Test doubles for the engine: an executor whose 'KV cache' stores token ids.

The next token is a hash of every token read back through the block table,
so any mistake in block tables, preemption, or block export/import changes
the output, exactly as it would with a real model.
"""
from __future__ import annotations

import hashlib

from llumnix.core.batch import ModelOutput, SchedulerOutput


class TokenCacheExecutor:
    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 1000) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.num_steps = 0

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * 8

    def _slot(self, block_ids: list[int], pos: int) -> int:
        return block_ids[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, batch: SchedulerOutput) -> ModelOutput:
        self.num_steps += 1
        sampled = []
        for r in batch.scheduled:
            for k, tok in enumerate(r.token_ids):
                self.slots[self._slot(r.block_ids, r.start_pos + k)] = tok
            ctx = [self.slots[self._slot(r.block_ids, p)] for p in range(r.context_len)]
            assert None not in ctx, f"{r.request_id} read an unwritten slot"
            h = hashlib.blake2b(repr((ctx, r.seed if not r.sampling_params.is_greedy else 0,
                                      r.output_index)).encode(), digest_size=8)
            sampled.append(int.from_bytes(h.digest(), "little") % self.vocab_size)
        return ModelOutput(sampled_token_ids=sampled)

    def gather_blocks(self, block_ids: list[int]) -> bytes:
        out = bytearray()
        for b in block_ids:
            for s in range(b * self.block_size, (b + 1) * self.block_size):
                v = self.slots[s]
                out += (-1 if v is None else v).to_bytes(8, "little", signed=True)
        return bytes(out)

    def scatter_blocks(self, block_ids: list[int], data: bytes) -> None:
        assert len(data) == len(block_ids) * self.bytes_per_block
        i = 0
        for b in block_ids:
            for s in range(b * self.block_size, (b + 1) * self.block_size):
                v = int.from_bytes(data[i:i + 8], "little", signed=True)
                self.slots[s] = None if v < 0 else v
                i += 8
