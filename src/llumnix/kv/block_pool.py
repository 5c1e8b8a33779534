"""A fixed pool of KV block ids. Ids are plain ints in [0, num_blocks)."""
from __future__ import annotations

from llumnix.core.errors import OutOfBlocksError


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        # A stack: recently freed blocks are reused first (warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._is_free = [True] * num_blocks
        self.num_free = num_blocks
        """``len`` of the free list, kept with it (read at every step and report: an
        attribute, not a property)."""

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError("cannot allocate a negative number of blocks")
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        ids = [self._free.pop() for _ in range(n)]
        self.num_free = len(self._free)
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, ids: list[int]) -> None:
        # Pushed last-first, so the next allocation pops them back in the order they
        # had: a freed request's ascending run is reallocated as an ascending run, which
        # a migration moves as one view per layer instead of one per block.
        try:
            for i in reversed(ids):
                if self._is_free[i]:
                    raise ValueError(f"block {i} freed twice")
                self._is_free[i] = True
                self._free.append(i)
        finally:
            self.num_free = len(self._free)

    def check_invariants(self) -> None:
        assert len(set(self._free)) == len(self._free), "duplicate ids on the free list"
        assert self.num_free == len(self._free), "the free count disagrees with the free list"
        assert sum(self._is_free) == len(self._free), "free flags disagree with the free list"
        assert all(self._is_free[i] for i in self._free), "a listed free block is marked used"
