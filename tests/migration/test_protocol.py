from __future__ import annotations

import pytest

from llumnix.migration import MigrationConfig, MigrationPhase, MigrationProtocol

P = MigrationPhase


def _stage(m, blocks, now, *, alive=True, unsent=0, dst_offset=100):
    assert m.begin_stage(blocks, now) in (P.RESERVE, P.PAUSE)
    if m.phase == P.PAUSE:
        return m.phase
    m.on_reserved([b + dst_offset for b in blocks], now)
    return m.on_copied(now + 0.01, request_alive=alive, num_unsent_blocks=unsent)


def test_multi_stage_migration_reaches_commit_with_downtime_of_last_stage_only():
    m = MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=3, last_stage_max_blocks=1),
                          now=0.0, bytes_per_block=10)
    assert _stage(m, list(range(40)), 0.0, unsent=5) == P.RESERVE  # 5 > 1 new blocks: pre-copy again
    assert _stage(m, list(range(40, 45)), 1.0, unsent=1, dst_offset=200) == P.PAUSE
    assert m.on_paused(2.0, request_alive=True) == P.RESERVE
    assert m.is_last_stage
    m.begin_stage([45], 2.0)
    m.on_reserved([300], 2.0)
    assert m.on_copied(2.005, request_alive=True, num_unsent_blocks=0) == P.COMMIT
    assert m.on_committed(2.02) == P.COMMITTED
    m.check_invariants()
    rep = m.report()
    assert rep.committed and rep.num_stages == 3 and rep.num_blocks == 46 and rep.num_bytes == 460
    assert rep.downtime == pytest.approx(0.02) and rep.duration == pytest.approx(2.02)


def test_stage_limit_forces_the_last_stage():
    m = MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=2, last_stage_max_blocks=0), 0.0)
    assert _stage(m, [1, 2, 3], 0.0, unsent=50) == P.PAUSE


@pytest.mark.parametrize("when", ["reserve", "post-stage", "pause", "failure", "timeout"])
def test_abort_paths(when):
    m = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    if when == "reserve":
        m.begin_stage([1, 2], 0.0)
        assert m.on_reserved(None, 0.1) == P.ABORTED
    elif when == "post-stage":
        assert _stage(m, [1, 2], 0.0, alive=False, unsent=9) == P.ABORTED
    elif when == "pause":
        assert _stage(m, [1, 2], 0.0, unsent=0) == P.PAUSE
        assert m.on_paused(0.2, request_alive=False) == P.ABORTED
    elif when == "failure":
        m.begin_stage([1], 0.0)
        m.on_reserved([9], 0.0)
        assert m.abort("destination died", 0.3) == P.ABORTED
    else:
        assert not m.is_timed_out(5.0) and m.is_timed_out(10.5)
        m.abort("timeout", 10.5)
    rep = m.report()
    assert not rep.committed and rep.abort_reason and rep.downtime is None
    with pytest.raises(RuntimeError):
        m.on_committed(11.0)  # nothing moves after an abort
    assert m.abort("again", 12.0) == P.ABORTED and m.abort_reason == rep.abort_reason


def test_queued_request_moves_as_metadata_and_one_stage_means_blocking_copy():
    q = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0, has_kv=False)
    assert q.phase == P.COMMIT and q.on_committed(0.001) == P.COMMITTED
    assert q.report().num_stages == 0
    # a queued request never stalls: no downtime (not 0 ms counted among the running ones)
    assert q.report().downtime is None and q.report().was_queued and not blocking_was_queued()
    blocking = MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=1), 0.0)
    assert blocking.phase == P.PAUSE
    blocking.on_paused(0.0, request_alive=True)
    blocking.begin_stage(list(range(30)), 0.0)
    blocking.on_reserved(list(range(30)), 0.0)
    assert blocking.on_copied(0.5, request_alive=True, num_unsent_blocks=0) == P.COMMIT
    blocking.on_committed(0.5)
    assert blocking.report().downtime == pytest.approx(0.5)
    blocking.check_invariants()


def test_empty_pre_copy_stage_goes_straight_to_pause():
    m = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    assert m.begin_stage([], 0.0) == P.PAUSE and not m.stages


def test_wrong_reservation_size_aborts():
    m = MigrationProtocol("r", "a", "b", MigrationConfig(), 0.0)
    m.begin_stage([1, 2, 3], 0.0)
    assert m.on_reserved([7], 0.0) == P.ABORTED


def test_blocks_adopted_from_the_destinations_cache_count_as_done_but_not_as_sent():
    m = MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=3, last_stage_max_blocks=1),
                          now=0.0, bytes_per_block=10)
    m.on_cached(30)
    assert m.num_blocks_done == 30 and m.num_blocks_sent == 0
    assert _stage(m, list(range(30, 40)), 0.0, unsent=1) == P.PAUSE
    assert m.num_blocks_done == 40
    with pytest.raises(RuntimeError):
        m.on_cached(5)  # only before the first stage
    m.on_paused(1.0, request_alive=True)
    m.begin_stage([40], 1.0)
    m.on_reserved([7], 1.0)
    m.on_copied(1.01, request_alive=True, num_unsent_blocks=0)
    m.on_committed(1.02)
    m.check_invariants()
    rep = m.report()
    assert rep.num_blocks == 11 and rep.num_bytes == 110 and rep.num_blocks_cached == 30
    queued = MigrationProtocol("q", "a", "b", MigrationConfig(), 0.0, has_kv=False)
    with pytest.raises(RuntimeError):
        queued.on_cached(1)  # no KV: nothing to adopt


def blocking_was_queued() -> bool:
    return MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=1), 0.0).report().was_queued


def test_following_a_prefill_copies_each_chunk_whatever_the_stage_limit_then_pauses_after_its_first_token():
    cfg = MigrationConfig(max_stages=2, last_stage_max_blocks=0, timeout_s=1.0, follow_prefill=True)
    m = MigrationProtocol("r", "a", "b", cfg, 0.0, bytes_per_block=10)
    for i in range(4):  # four chunks of 4 blocks, 0.9 s apart: past both the stage limit and the timeout
        t = 0.9 * i
        assert not m.is_timed_out(t + 0.05)  # 0.94 s after the last chunk's stage: counted from there
        m.begin_stage(list(range(4 * i, 4 * i + 4)), t)
        m.on_reserved(list(range(100 + 4 * i, 104 + 4 * i)), t)
        assert m.on_copied(t + 0.01, request_alive=True, num_unsent_blocks=9, is_prefilling=True) == P.RESERVE
    assert m.is_timed_out(2.71 + 1.01)
    # the first token is out (the boundary after it): the tail goes in the last stage
    m.begin_stage([], 3.0)
    assert m.phase == P.PAUSE and m.on_paused(3.0, request_alive=True) == P.RESERVE
    m.begin_stage([16, 17], 3.0)
    m.on_reserved([116, 117], 3.0)
    assert m.on_copied(3.01, request_alive=True, num_unsent_blocks=0) == P.COMMIT
    m.on_committed(3.02)
    m.check_invariants()
    rep = m.report()
    assert (rep.num_stages, rep.num_prefill_stages, rep.num_last_stage_blocks, rep.num_bytes) == (5, 4, 2, 180)
    # a stage copied after the first token came out: the usual rule (here the stage limit) pauses
    m2 = MigrationProtocol("r", "a", "b", cfg, 0.0)
    m2.begin_stage([0, 1], 0.0)
    m2.on_reserved([5, 6], 0.0)
    assert m2.on_copied(0.1, request_alive=True, num_unsent_blocks=9, is_prefilling=False) == P.PAUSE
    # without follow_prefill, is_prefilling changes nothing: the stage limit holds
    m3 = MigrationProtocol("r", "a", "b", MigrationConfig(max_stages=2, last_stage_max_blocks=0), 0.0)
    m3.begin_stage([0, 1], 0.0)
    m3.on_reserved([5, 6], 0.0)
    assert m3.on_copied(0.1, request_alive=True, num_unsent_blocks=9, is_prefilling=True) == P.PAUSE
