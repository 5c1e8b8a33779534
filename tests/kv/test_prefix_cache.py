"""Prefix caching in the KV manager: sharing, release, eviction, and the free count."""
from __future__ import annotations

import pytest

from llumnix.core.errors import OutOfBlocksError
from llumnix.kv.kv_manager import KVManager

BS = 4


def _admit(kv: KVManager, rid: str, tokens: list[int]) -> list[int]:
    """Allocate with a lookup, then mark the whole sequence computed (as a prefill does)."""
    cached = kv.match_prefix(tokens)
    assert kv.can_allocate(len(tokens), cached)
    table = kv.allocate(rid, len(tokens), cached)
    kv.cache_computed(rid, tokens, [], len(tokens))
    kv.check_invariants()
    return table


def test_a_shared_prefix_shares_blocks_and_the_last_token_is_always_computed():
    kv = KVManager(16, BS, watermark=0.0, prefix_caching=True)
    a = _admit(kv, "a", list(range(10)))             # blocks 0-1 full, 2 partial
    assert kv.match_prefix(list(range(10)))[0] == a[:2]
    assert kv.match_prefix(list(range(8)))[0] == a[:1]  # 8 tokens: 2 full blocks, but the last token is computed
    b = _admit(kv, "b", list(range(8)) + [99, 98])
    assert b[:2] == a[:2] and b[2] != a[2]
    assert kv.num_used_blocks == 4  # 3 of a's, b's own third
    assert kv.match_prefix([1, 2, 3, 4, 5])[0] == []  # a different first block: no match at all


def test_released_blocks_stay_findable_count_as_free_and_go_least_recently_released_first():
    kv = KVManager(6, BS, watermark=0.0, prefix_caching=True)
    a = _admit(kv, "a", list(range(9)))    # 3 blocks, 2 keyed
    b = _admit(kv, "b", list(range(50, 59)))
    assert kv.num_free_blocks == 0
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 6 and kv.num_used_blocks == 0
    kv.check_invariants()
    # a was released first, so its blocks go first, its tail before its head (a head
    # evicted first would leave the blocks after it unreachable)
    c = kv.allocate("c", 9)  # 3 blocks: the pool's 2 unkeyed ones, then one eviction
    kv.check_invariants()
    assert a[1] in c and a[0] not in c
    assert kv.match_prefix(list(range(9)))[0] == a[:1]
    assert kv.match_prefix(list(range(50, 59)))[0] == b[:2]


def test_a_matched_evictable_block_counts_against_the_free_space():
    kv = KVManager(4, BS, watermark=0.0, prefix_caching=True)
    _admit(kv, "a", list(range(13)))   # 4 blocks, 3 keyed
    kv.free("a")
    cached = kv.match_prefix(list(range(13)))
    assert len(cached[0]) == 3
    assert kv.can_allocate(13, cached)          # 3 from the cache + 1 new of 4 free
    assert not kv.can_allocate(17, cached)       # would need 2 new
    kv.allocate("b", 13, cached)
    assert kv.num_free_blocks == 0
    with pytest.raises(OutOfBlocksError):
        kv.allocate("c", 1)
    kv.check_invariants()


def test_held_blocks_are_never_evicted():
    kv = KVManager(5, BS, watermark=0.0, prefix_caching=True)
    a = _admit(kv, "a", list(range(9)))
    _admit(kv, "b", list(range(9)))   # shares a's 2 keyed blocks, owns a third
    kv.free("a")                      # b still holds the shared ones
    assert kv.num_free_blocks == 2    # a's own third block, and the spare
    kv.allocate("c", 8)
    assert not set(kv.block_table("c")) & set(a[:2])
    kv.check_invariants()


def test_reservations_take_fresh_blocks_and_invariants_catch_a_bad_count():
    kv = KVManager(8, BS, watermark=0.0, prefix_caching=True)
    _admit(kv, "a", list(range(9)))
    kv.free("a")
    got = kv.reserve("m", 8)           # takes the 6 free and evicts 2 cached blocks
    assert len(got) == 8 and kv.num_free_blocks == 0 and kv.match_prefix(list(range(9)))[0] == []
    kv.check_invariants()
    kv.free("m")
    assert kv.num_free_blocks == 8
    _admit(kv, "x", list(range(9)))
    assert kv.prefix is not None
    b = kv.block_table("x")[0]
    kv.prefix.refs[b] += 1
    with pytest.raises(AssertionError):
        kv.check_invariants()
