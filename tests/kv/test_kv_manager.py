from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llumnix.core.errors import OutOfBlocksError
from llumnix.kv import BlockPool, KVManager


def test_pool_allocates_distinct_ids_and_detects_double_free():
    pool = BlockPool(8)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert len(set(a + b)) == 8 and pool.num_free == 0
    with pytest.raises(OutOfBlocksError):
        pool.allocate(1)
    pool.free(a)
    with pytest.raises(ValueError):
        pool.free(a[:1])
    pool.check_invariants()
    assert pool.num_free == 3


def test_blocks_for_tokens_rounds_up():
    kv = KVManager(10, block_size=16)
    assert [kv.num_blocks_for(n) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]


def test_watermark_blocks_admission_but_not_growth():
    kv = KVManager(100, block_size=4, watermark=0.1)  # 10 watermark blocks
    assert kv.can_allocate(90 * 4)
    assert not kv.can_allocate(91 * 4)
    kv.allocate("a", 90 * 4)
    # A running request may dip into the watermark to grow.
    assert kv.can_append("a", 95 * 4)
    assert kv.append_slot("a", 95 * 4) and kv.num_free_blocks == 5
    assert not kv.can_append("a", 101 * 4)
    kv.check_invariants()


def test_append_slot_only_adds_missing_blocks():
    kv = KVManager(10, block_size=4)
    kv.allocate("a", 5)  # 2 blocks
    assert kv.append_slot("a", 8) == []
    assert len(kv.append_slot("a", 9)) == 1
    assert kv.num_blocks_of("a") == 3


def test_reservation_commit_and_release():
    kv = KVManager(20, block_size=4, watermark=0.1)  # 2 watermark blocks
    assert not kv.can_reserve(19)
    first = kv.reserve("m", 5)
    more = kv.reserve("m", 3)  # a later stage extends the same reservation
    assert kv.block_table("m") == first + more and kv.num_reserved_blocks == 8
    kv.check_invariants()
    table = kv.commit_reservation("m")
    assert len(table) == 8 and kv.num_reserved_blocks == 0
    kv.reserve("n", 4)
    assert kv.free("n") == 4 and not kv.has("n")
    with pytest.raises(ValueError):
        kv.reserve("m", 1)  # "m" is live now, not incoming
    kv.check_invariants()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "append", "reserve", "free"]),
                          st.integers(0, 5), st.integers(1, 40)), max_size=60))
def test_random_operations_keep_accounting_exact(ops):
    kv = KVManager(32, block_size=4, watermark=0.05)
    for op, rid, n in ops:
        r = f"r{rid}"
        if op == "alloc" and not kv.has(r) and kv.can_allocate(n):
            kv.allocate(r, n)
        elif op == "append" and kv.has(r) and not kv.is_reserved(r) and kv.can_append(r, n):
            kv.append_slot(r, n)
        elif op == "reserve" and (not kv.has(r) or kv.is_reserved(r)) and kv.can_reserve(n // 4):
            kv.reserve(r, n // 4)
        elif op == "free":
            kv.free(r)
        kv.check_invariants()
    for rid in range(6):
        kv.free(f"r{rid}")
    kv.check_invariants()
    assert kv.num_free_blocks == 32


@pytest.mark.parametrize("caching", [False, True])
def test_status_counts_are_the_properties(caching):
    """What a status report reads in one call (``status_counts``) is what the properties say,
    with reservations and, with prefix caching, shared and evictable blocks."""
    kv = KVManager(24, block_size=4, prefix_caching=caching)

    def properties():
        return (kv.num_total_blocks, kv.num_used_blocks, kv.num_reserved_blocks, kv.num_shared_block_holds,
                len(kv.reserved_ids()))

    assert kv.status_counts() == properties() == (24, 0, 0, 0, 0)
    prompt = list(range(12))
    kv.allocate("a", 13, kv.match_prefix(prompt) if caching else None)
    if caching:
        kv.cache_computed("a", prompt, [], 12)
        kv.allocate("b", 13, kv.match_prefix(prompt))  # shares a's three full blocks
    kv.reserve("m", 3)
    assert kv.status_counts() == properties()
    _, _, reserved, shared, num_reservations = kv.status_counts()
    assert (reserved, num_reservations) == (3, 1) and (shared > 0) == caching
    kv.free("a")
    kv.free("b")  # cached blocks stay, evictable: free for the counts
    assert kv.status_counts() == properties()
    kv.check_invariants()
