"""Per-request block tables over a BlockPool, with a watermark for admission.

A table's blocks cover the request's tokens in order::

    tokens  0..15 | 16..31 | 32..47 | 48..
    table  [  7   ,   2    ,  11    ]        block_size = 16, 40 tokens

Tables also hold *reservations*: blocks taken for a request that is
migrating in and not yet installed. They count as used; ``free`` releases
either kind.
"""
from __future__ import annotations

from llumnix.core.errors import OutOfBlocksError, UnknownRequestError
from llumnix.kv.block_pool import BlockPool


class KVManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.num_watermark_blocks = int(watermark * num_blocks)
        self._tables: dict[str, list[int]] = {}
        self._reserved: set[str] = set()

    # -- sizes -------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def num_reserved_blocks(self) -> int:
        return sum(len(self._tables[r]) for r in self._reserved)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- tables ------------------------------------------------------------
    def has(self, request_id: str) -> bool:
        return request_id in self._tables

    def block_table(self, request_id: str) -> list[int]:
        try:
            return self._tables[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    def num_blocks_of(self, request_id: str) -> int:
        table = self._tables.get(request_id)
        return 0 if table is None else len(table)

    # -- admission ---------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        need = self.num_blocks_for(num_tokens)
        return self.pool.num_free - need >= self.num_watermark_blocks

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already has blocks")
        table = self.pool.allocate(self.num_blocks_for(num_tokens))
        self._tables[request_id] = table
        return table

    # -- growth during decode ----------------------------------------------
    def num_missing_blocks(self, request_id: str, num_tokens: int) -> int:
        return max(0, self.num_blocks_for(num_tokens) - len(self.block_table(request_id)))

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        """Can the table grow to hold ``num_tokens``? Running requests may use the watermark."""
        return self.num_missing_blocks(request_id, num_tokens) <= self.pool.num_free

    def append_slot(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the table to hold ``num_tokens``; returns the blocks added."""
        missing = self.num_missing_blocks(request_id, num_tokens)
        if missing > self.pool.num_free:
            raise OutOfBlocksError(f"{request_id} needs {missing} blocks, {self.pool.num_free} free")
        new = self.pool.allocate(missing)
        self._tables[request_id].extend(new)
        return new

    def grow(self, request_id: str, num_blocks: int) -> list[int]:
        """Add ``num_blocks`` blocks to a live table (the scheduler checked they exist)."""
        new = self.pool.allocate(num_blocks)
        self._tables[request_id].extend(new)
        return new

    # -- migration reservations --------------------------------------------
    def can_reserve(self, num_blocks: int) -> bool:
        return self.pool.num_free - num_blocks >= self.num_watermark_blocks

    def reserve(self, request_id: str, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` more blocks for an incoming request; returns them."""
        if request_id in self._tables and request_id not in self._reserved:
            raise ValueError(f"request {request_id} is live here, not incoming")
        if not self.can_reserve(num_blocks):
            raise OutOfBlocksError(f"cannot reserve {num_blocks} blocks above the watermark")
        new = self.pool.allocate(num_blocks)
        self._tables.setdefault(request_id, []).extend(new)
        self._reserved.add(request_id)
        return new

    def is_reserved(self, request_id: str) -> bool:
        return request_id in self._reserved

    def commit_reservation(self, request_id: str) -> list[int]:
        """The incoming request is installed: its reservation becomes its table."""
        if request_id not in self._reserved:
            raise UnknownRequestError(request_id)
        self._reserved.discard(request_id)
        return self._tables[request_id]

    def reserved_ids(self) -> list[str]:
        return list(self._reserved)

    # -- release -------------------------------------------------------------
    def free(self, request_id: str) -> int:
        """Release every block of a table or reservation; returns how many."""
        table = self._tables.pop(request_id, None)
        self._reserved.discard(request_id)
        if table is None:
            return 0
        self.pool.free(table)
        return len(table)

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        owned = [b for table in self._tables.values() for b in table]
        assert len(owned) == len(set(owned)), "a block is in two tables"
        assert len(owned) == self.pool.num_used, (
            f"tables hold {len(owned)} blocks but the pool has {self.pool.num_used} in use"
        )
        assert self._reserved <= self._tables.keys(), "a reservation without a table"
        if owned:
            assert min(owned) >= 0 and max(owned) < self.pool.num_blocks, "block id out of range"
