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


def test_evicted_keys_are_logged_once_and_the_log_is_bounded():
    kv = KVManager(6, BS, watermark=0.0, prefix_caching=True)
    a = list(range(9))
    _admit(kv, "a", a)    # 3 blocks, 2 keyed
    kv.free("a")
    assert kv.take_evicted_keys() == []  # released, still cached: nothing evicted
    kv.allocate("c", 5 * BS)  # 5 blocks: the pool's 4 unkeyed ones, then a's tail block
    assert kv.take_evicted_keys() == [kv.prefix_keys(a)[1]]
    assert kv.take_evicted_keys() == []  # taken once
    kv.free("c")
    # the log keeps a pool's worth of keys, the newest
    for r in range(3):
        _admit(kv, f"x{r}", [100 * (r + 1) + t for t in range(2 * BS + 1)])
        kv.free(f"x{r}")
    evicted = kv.take_evicted_keys()
    assert 0 < len(evicted) <= 6 and len(set(evicted)) == len(evicted)
    kv.check_invariants()
    assert KVManager(6, BS).take_evicted_keys() == []  # no caching, no log


def test_a_block_evicted_and_cached_again_before_the_report_is_not_reported():
    kv = KVManager(6, BS, watermark=0.0, prefix_caching=True)
    a = list(range(9))
    _admit(kv, "a", a)
    kv.free("a")
    kv.allocate("c", 5 * BS)  # evicts a's tail block
    kv.free("c")
    _admit(kv, "a2", a)  # a comes back and computes that block again: it is cached once more
    assert kv.match_prefix(a)[0] and len(kv.match_prefix(a)[0]) == 2
    assert kv.take_evicted_keys() == []


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


def test_a_migration_reservation_adopts_the_cached_leading_blocks_by_their_keys():
    """A destination given the keys of an incoming request's full blocks takes the ones
    it caches into the reservation (held, never evicted); the rest is reserved fresh; the
    admission hit rate does not count them; release and install keep the accounting exact."""
    from llumnix.kv.prefix_cache import sequence_keys

    kv = KVManager(12, BS, watermark=0.0, prefix_caching=True)
    a = _admit(kv, "a", list(range(13)))            # 3 keyed blocks, one partial
    seq = list(range(8)) + [70, 71, 72, 73, 74]     # agrees with a for 2 blocks
    keys = sequence_keys(seq, [], 3, BS)
    hits = kv.prefix.num_hit_tokens
    assert kv.reserve_cached("m", keys) == 2
    assert kv.block_table("m") == a[:2] and kv.is_reserved("m")
    assert kv.prefix.num_hit_tokens == hits and kv.num_shared_block_holds == 2
    kv.reserve("m", 2)                               # block 2 and the partial one: sent
    kv.check_invariants()
    kv.free("a")
    kv.allocate("big", 4 * BS)                       # takes every free block it can
    assert set(a[:2]) <= set(kv.block_table("m"))    # adopted blocks are held, not evictable
    kv.check_invariants()
    kv.free("m")                                     # an abort: back to evictable
    kv.check_invariants()
    assert kv.match_prefix(seq)[0] == a[:2]
    # committed, the request keys its own blocks from where the adopted ones end
    assert kv.reserve_cached("n", keys) == 2
    kv.reserve("n", 2)
    kv.commit_reservation("n")
    kv.cache_computed("n", seq, [], len(seq))
    assert kv.match_prefix(seq + [1])[0] == kv.block_table("n")[:3]
    kv.check_invariants()


def test_nothing_adopted_without_a_match_without_caching_or_over_the_watermark():
    from llumnix.kv.prefix_cache import sequence_keys

    keys = sequence_keys(list(range(9)), [], 2, BS)
    assert KVManager(8, BS, prefix_caching=False).reserve_cached("m", keys) == 0
    kv = KVManager(8, BS, watermark=0.25, prefix_caching=True)   # 2 watermark blocks
    assert kv.reserve_cached("m", keys) == 0 and not kv.has("m")
    _admit(kv, "a", list(range(9)))
    kv.free("a")                                     # 2 keyed evictable blocks
    kv.allocate("b", 5 * BS)                         # from the pool: 1 left there
    assert kv.num_free_blocks == 3
    assert kv.reserve_cached("m", keys) == 0         # taking the 2 evictable ones would cross it
    assert len(kv.match_prefix(list(range(9)))[0]) == 2
    kv.free("b")
    assert kv.reserve_cached("m", keys) == 2
    kv.check_invariants()


def test_shared_blocks_of_a_table_are_the_leading_ones_others_hold():
    kv = KVManager(16, BS, watermark=0.0, prefix_caching=True)
    _admit(kv, "a", list(range(13)))                  # 3 keyed blocks + 1
    _admit(kv, "b", list(range(8)) + [90, 91, 92])    # shares 2
    assert kv.num_shared_blocks_of("a") == kv.num_shared_blocks_of("b") == 2
    _admit(kv, "c", list(range(13)))                  # shares a's 3 keyed blocks
    assert (kv.num_shared_blocks_of("a"), kv.num_shared_blocks_of("c")) == (3, 3)
    kv.free("a")
    assert (kv.num_shared_blocks_of("b"), kv.num_shared_blocks_of("c")) == (2, 2)
    assert kv.num_shared_blocks_of("gone") == 0
    assert KVManager(4, BS).num_shared_blocks_of("x") == 0


def test_the_first_stage_reservation_adopts_then_reserves_the_rest_or_nothing():
    """``EngineCore.try_reserve_with_cache``: adopted + fresh blocks in one step, and a
    refusal leaves nothing reserved (the adopted blocks go back to the cache)."""
    from llumnix.kv.prefix_cache import sequence_keys
    from tests.engine.helpers import make_engine

    eng = make_engine(num_blocks=10, block_size=BS, prefix_caching=True)
    _admit(eng.kv, "a", list(range(13)))            # 3 keyed blocks + 1 of 10
    keys = sequence_keys(list(range(12)) + [50] * 8, [], 5, BS)
    n, fresh = eng.try_reserve_with_cache("m", keys)
    assert n == 3 and len(fresh) == 2 and eng.kv.block_table("m")[:3] == eng.kv.block_table("a")[:3]
    eng.kv.check_invariants()
    assert eng.try_reserve_with_cache("m", keys) is None     # already reserving here
    eng.release_reservation("m")
    big = sequence_keys(list(range(12)) + [50] * 40, [], 13, BS)
    assert eng.try_reserve_with_cache("m", big) is None      # 10 fresh blocks: more than 6 free
    assert not eng.kv.has("m") and eng.kv.num_shared_block_holds == 0
    eng.kv.check_invariants()
