"""BlockPool: allocation order and double frees."""
from __future__ import annotations

import pytest

from llumnix.kv.block_pool import BlockPool


def test_a_fresh_pool_hands_out_ascending_ids():
    assert BlockPool(8).allocate(4) == [0, 1, 2, 3]


def test_freed_blocks_come_back_in_the_order_they_had():
    # A migrated request's blocks, freed on the source, are what the next migration in
    # reserves there; ascending runs move as one socket view per layer, not one per block.
    pool = BlockPool(16)
    first = pool.allocate(6)
    pool.allocate(2)
    pool.free(first)
    assert pool.allocate(6) == first
    pool.check_invariants()


def test_a_double_free_is_refused():
    pool = BlockPool(4)
    ids = pool.allocate(2)
    pool.free(ids)
    with pytest.raises(ValueError):
        pool.free([ids[0]])
    with pytest.raises(ValueError):
        pool.free([2, 2])
