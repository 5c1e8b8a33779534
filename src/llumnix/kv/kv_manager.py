"""Per-request block tables over a BlockPool, with a watermark for admission.

A table's blocks cover the request's tokens in order::

    tokens  0..15 | 16..31 | 32..47 | 48..
    table  [  7   ,   2    ,  11    ]        block_size = 16, 40 tokens

Tables also hold *reservations*: blocks taken for a request that is
migrating in and not yet installed. They count as used; ``free`` releases
either kind.

With ``prefix_caching`` (``kv/prefix_cache.py``) a table may start with full blocks
that other tables share, and released full blocks stay findable until an allocation
needs them; such evictable blocks count as free everywhere (admission, freeness).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from llumnix.core.errors import OutOfBlocksError, UnknownRequestError
from llumnix.kv.block_pool import BlockPool
from llumnix.kv.prefix_cache import PrefixCache


class KVManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01,
                 prefix_caching: bool = False) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.num_watermark_blocks = int(watermark * num_blocks)
        self._tables: dict[str, list[int]] = {}
        self.tables: Mapping[str, list[int]] = self._tables
        """Every block table by request id, read only: for the hot paths that count the
        blocks of every request at once (the status snapshot, a decode step's growth). The
        table dict itself as an attribute, not a property: CPython 3.11 runs a property's
        getter in a C frame of its own, and this is read at every step and report."""
        self._reserved: set[str] = set()
        # The eviction log holds a pool's worth: more evictions than that between two
        # status reports and the router keeps a few stale entries (as with no log at all).
        self.prefix: PrefixCache | None = PrefixCache(block_size, num_blocks) if prefix_caching else None

    # -- sizes -------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: the pool's, and cached blocks no table holds."""
        if self.prefix is None:
            return self.pool.num_free
        return self.pool.num_free + len(self.prefix.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.num_free_blocks

    @property
    def num_shared_block_holds(self) -> int:
        """How many more blocks the tables' lengths add up to than they hold: a block
        shared by k tables (prefix caching) counts k times in their lengths, once here."""
        return 0 if self.prefix is None else self.prefix.num_extra_holds

    def num_shared_blocks_of(self, request_id: str) -> int:
        """Blocks of the table other tables hold too (they stay if it goes). Shared blocks
        lead a table: a block is shared only if every block before it is."""
        if self.prefix is None:
            return 0
        refs, n = self.prefix.refs, 0
        for b in self._tables.get(request_id, ()):
            if refs.get(b, 0) < 2:
                break
            n += 1
        return n

    @property
    def num_reserved_blocks(self) -> int:
        if not self._reserved:  # read by every status report; most engines hold none
            return 0
        return sum(len(self._tables[r]) for r in self._reserved)

    def status_counts(self) -> tuple[int, int, int, int, int]:
        """(``num_total_blocks``, ``num_used_blocks``, ``num_reserved_blocks``,
        ``num_shared_block_holds``, reservations): what a status report reads, in one call
        (every report reads them, and CPython 3.11 runs each property's getter in a C frame
        of its own). ``check_invariants`` holds them equal to the properties."""
        free = self.pool.num_free if self.prefix is None else self.pool.num_free + len(self.prefix.evictable)
        reserved = self._reserved
        return (self.pool.num_blocks, self.pool.num_blocks - free,
                sum(len(self._tables[r]) for r in reserved) if reserved else 0,
                0 if self.prefix is None else self.prefix.num_extra_holds, len(reserved))

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

    def _take(self, n: int) -> list[int]:
        """``n`` blocks from the pool, evicting cached blocks when it runs short."""
        if self.prefix is not None and n > self.pool.num_free:
            short = min(n - self.pool.num_free, len(self.prefix.evictable))
            self.pool.free([self.prefix.evict() for _ in range(short)])
        return self.pool.allocate(n)

    # -- admission ---------------------------------------------------------
    def match_prefix(self, prompt: Sequence[int], output: Sequence[int] = ()) -> tuple[list[int], bytes]:
        """The cached blocks that already hold the sequence's leading tokens (none
        without prefix caching); pass them to ``can_allocate`` and ``allocate``."""
        if self.prefix is None:
            return [], b""
        return self.prefix.match(prompt, output)

    def take_evicted_keys(self) -> list[bytes]:
        """Keys of the cached blocks evicted since the last call (none without caching)."""
        return [] if self.prefix is None else self.prefix.take_evicted()

    def prefix_keys(self, prompt: Sequence[int], output: Sequence[int] = ()) -> list[bytes]:
        """The keys ``match_prefix`` would walk for this sequence, all hashed now; for a
        sequence looked up again and again (``match_prefix_keys``). Empty without caching."""
        return [] if self.prefix is None else list(self.prefix.lookup_keys(prompt, output))

    def match_prefix_keys(self, keys: Sequence[bytes]) -> tuple[list[int], bytes]:
        """``match_prefix`` for keys from ``prefix_keys``: dictionary lookups, no hashing."""
        if self.prefix is None:
            return [], b""
        return self.prefix.match_keys(keys)

    def blocks_needed(self, num_tokens: int, cached: tuple[list[int], bytes] | None = None) -> int:
        """Free blocks a table for ``num_tokens`` tokens would take: matched blocks that
        other tables hold take none; matched evictable ones leave the free count too."""
        need = self.num_blocks_for(num_tokens)
        if cached is not None and cached[0]:
            assert self.prefix is not None
            need += self.prefix.num_evictable_in(cached[0]) - len(cached[0])
        return need

    def can_allocate(self, num_tokens: int, cached: tuple[list[int], bytes] | None = None) -> bool:
        return self.num_free_blocks - self.blocks_needed(num_tokens, cached) >= self.num_watermark_blocks

    def allocate(self, request_id: str, num_tokens: int, cached: tuple[list[int], bytes] | None = None,
                 ) -> list[int]:
        """A table for ``num_tokens`` tokens; with ``cached`` (``match_prefix``'s answer)
        it starts with those blocks, whose tokens need no computing."""
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already has blocks")
        head: list[int] = []
        if cached is not None:
            assert self.prefix is not None
            head = list(cached[0])
            self.prefix.acquire(request_id, num_tokens, head, cached[1])
        table = head + self._take(self.num_blocks_for(num_tokens) - len(head))
        self._tables[request_id] = table
        return table

    def cache_computed(self, request_id: str, prompt: Sequence[int], output: Sequence[int],
                       num_computed: int) -> None:
        """The request's KV is computed up to ``num_computed`` tokens: its full blocks
        become findable by other requests (a no-op without prefix caching)."""
        if self.prefix is not None and request_id in self._tables and request_id not in self._reserved:
            self.prefix.add(request_id, self._tables[request_id], prompt, output, num_computed)

    # -- growth during decode ----------------------------------------------
    def num_missing_blocks(self, request_id: str, num_tokens: int) -> int:
        return max(0, self.num_blocks_for(num_tokens) - len(self.block_table(request_id)))

    def can_append(self, request_id: str, num_tokens: int) -> bool:
        """Can the table grow to hold ``num_tokens``? Running requests may use the watermark."""
        return self.num_missing_blocks(request_id, num_tokens) <= self.num_free_blocks

    def append_slot(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the table to hold ``num_tokens``; returns the blocks added."""
        missing = self.num_missing_blocks(request_id, num_tokens)
        if missing > self.num_free_blocks:
            raise OutOfBlocksError(f"{request_id} needs {missing} blocks, {self.num_free_blocks} free")
        new = self._take(missing)
        self._tables[request_id].extend(new)
        return new

    def grow(self, request_id: str, num_blocks: int) -> list[int]:
        """Add ``num_blocks`` blocks to a live table (the scheduler checked they exist)."""
        new = self._take(num_blocks)
        self._tables[request_id].extend(new)
        return new

    # -- migration reservations --------------------------------------------
    def can_reserve(self, num_blocks: int) -> bool:
        return self.num_free_blocks - num_blocks >= self.num_watermark_blocks

    def reserve(self, request_id: str, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` more blocks for an incoming request; returns them."""
        if request_id in self._tables and request_id not in self._reserved:
            raise ValueError(f"request {request_id} is live here, not incoming")
        if not self.can_reserve(num_blocks):
            raise OutOfBlocksError(f"cannot reserve {num_blocks} blocks above the watermark")
        new = self._take(num_blocks)
        self._tables.setdefault(request_id, []).extend(new)
        self._reserved.add(request_id)
        return new

    def reserve_cached(self, request_id: str, keys: Sequence[bytes]) -> int:
        """Start an incoming request's reservation with the blocks this cache already
        holds for its leading blocks (``keys``: their ``sequence_keys``, computed where
        its tokens are); returns how many, which its source then need not send. 0 without
        prefix caching, on no match, or when taking the matched evictable blocks would
        cross the watermark."""
        if self.prefix is None or request_id in self._tables or not keys:
            return 0
        blocks, key = self.prefix.match_keys(keys)
        if not blocks or not self.can_reserve(self.prefix.num_evictable_in(blocks)):
            return 0
        self.prefix.acquire(request_id, 0, blocks, key)
        self._tables[request_id] = list(blocks)
        self._reserved.add(request_id)
        return len(blocks)

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
        self.pool.free(table if self.prefix is None else self.prefix.release(request_id, table))
        return len(table)

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        owned = [b for table in self._tables.values() for b in table]
        holders: dict[int, int] = {}
        for b in owned:
            holders[b] = holders.get(b, 0) + 1
        if self.prefix is None:
            assert len(owned) == len(holders), "a block is in two tables"
            cached = 0
        else:
            self.prefix.check_invariants(holders)
            cached = len(self.prefix.evictable)
        assert len(holders) + cached == self.pool.num_used, (
            f"tables hold {len(holders)} blocks and the cache {cached} but the pool has "
            f"{self.pool.num_used} in use")
        assert self._reserved <= self._tables.keys(), "a reservation without a table"
        assert self.status_counts() == (self.num_total_blocks, self.num_used_blocks, self.num_reserved_blocks,
                                        self.num_shared_block_holds, len(self._reserved)), "status counts drifted"
        if owned:
            assert min(owned) >= 0 and max(owned) < self.pool.num_blocks, "block id out of range"
