"""Llumlet: report, selection excluding migrating requests, keep-migrating rule."""
from __future__ import annotations

import pytest

from llumnix.core.sampling_params import SamplingParams
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from llumnix.policy.llumlet import flag_status
from tests.engine.helpers import make_engine
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait


class StaticEngine:
    def __init__(self, status):
        self.status = status

    def snapshot(self, migrating, fields):
        return flag_status(self.status, migrating, **fields)


BUSY = inst("engine-id", ts=-1.0, running=[run("short", 2, 20), run("long", 90, 1400)],
            waiting=[wait("q", 32)], hol=2)   # F = (100 - 92 - 2) / 2 = 3


def llumlet(status=BUSY, out=5.0, **kw):
    cfg = ReschedulingConfig(out_threshold=out, in_threshold=max(out, 5.0), **kw)
    return Llumlet("i7", StaticEngine(status), cfg, NO_HEADROOM)


def test_report_adds_what_only_the_llumlet_knows():
    ll = llumlet()
    ll.is_terminating = True
    ll.on_migration_started("long")
    ll.on_migration_started("q")
    s = ll.report(now=12.5)
    assert (s.instance_id, s.timestamp, s.is_terminating, s.num_migrating_out) == ("i7", 12.5, True, 2)
    assert [r.is_migrating for r in s.running] == [False, True]
    assert [r.is_migrating for r in s.waiting] == [True]


def test_selection_skips_requests_already_migrating():
    ll = llumlet()
    assert ll.select_requests_to_migrate(0.0, 3) == ["short", "q", "long"]
    ll.on_migration_started("short")
    assert ll.select_requests_to_migrate(0.0, 3) == ["q", "long"]
    ll.on_migration_finished("short", committed=False)  # aborted: it may be chosen again
    assert ll.select_requests_to_migrate(0.0) == ["short"]


@pytest.mark.parametrize("status,out,terminating,migrating,expected", [
    (BUSY, 5.0, False, (), True),                          # F = 3 < 5: still a source
    (BUSY, 3.0, False, (), False),                         # F = 3 is not below 3
    (inst("e", running=[run("a", 1)]), 3.0, True, (), True),       # terminating: until empty
    (inst("e", running=[run("a", 1)]), 3.0, True, ("a",), False),  # only a migrating request left
    (inst("e"), 3.0, True, (), False),
])
def test_should_keep_migrating(status, out, terminating, migrating, expected):
    ll = llumlet(status, out)
    ll.is_terminating = terminating
    for rid in migrating:
        ll.on_migration_started(rid)
    assert ll.should_keep_migrating(0.0, IDLE, 0) is expected


IDLE = inst("d")  # F = 100: a destination


@pytest.mark.parametrize("dst,num_in,expected", [
    (IDLE, 0, True),
    (inst("d", term=True), 0, False),                  # became terminating meanwhile
    (inst("d", sched=False), 0, False),                # unhealthy
    (inst("d", running=[run("x", 96, 1500)]), 0, False),  # F = 4: no longer above the in threshold (5)
    (IDLE, 1, False),                                  # another source's migration is coming in (max_in 1)
    (inst("d", mig_in=1), 0, True),                    # a reservation the caller says is ours, committed
])
def test_the_chain_stops_when_the_destination_stops_being_one(dst, num_in, expected):
    """The simulator checked this and the cluster did not, until both used policy.rounds."""
    assert llumlet(BUSY, 5.0).should_keep_migrating(0.0, dst, num_in) is expected


@pytest.mark.parametrize("status,expected", [
    (inst("e"), True),
    (inst("e", running=[run("a", 1)]), False),
    (inst("e", waiting=[wait("q", 4)]), False),
    (inst("e", mig_in=1), False),                    # a migration still coming in
])
def test_a_terminating_instance_is_drained_when_it_holds_nothing(status, expected):
    ll = llumlet(status)
    assert not ll.is_drained(0.0)  # not terminating: never "drained"
    ll.is_terminating = True
    assert ll.is_drained(0.0) is expected


def test_beside_a_real_engine():
    eng = make_engine(num_blocks=16, block_size=4)
    ll = Llumlet("i0", eng, ReschedulingConfig(), FreenessConfig())
    for k, n in enumerate((8, 4, 12)):
        eng.add_request(f"r{k}", list(range(1, n + 1)), SamplingParams(max_tokens=4))
    eng.step()
    s = ll.report(1.0)
    assert s.timestamp == 1.0 and s.num_total_blocks == 16
    assert ll.select_requests_to_migrate(1.0, 5) == ["r1", "r0", "r2"]  # shorter first
    assert ll.freeness(1.0) == (16 - s.num_used_blocks) / s.num_running


def test_engine_snapshot_equals_flagging_a_plain_snapshot():
    """EngineCore flags migrating requests while it builds the snapshot; the result must
    be what flagging its plain snapshot gives."""
    eng = make_engine(num_blocks=32, block_size=4)
    for k, n in enumerate((8, 4, 12, 30)):
        eng.add_request(f"r{k}", list(range(1, n + 1)), SamplingParams(max_tokens=4))
    eng.step()
    eng.clock.advance_to(3.0)  # the report's timestamp on the engine's clock (a shift moves arrivals: test_overdue)
    fields = {"instance_id": "x", "timestamp": 3.0, "is_terminating": True, "num_migrating_out": 2}
    fast = eng.get_status(migrating={"r1", "r3"}, **fields)
    slow = flag_status(eng.get_status(), {"r1", "r3"}, **fields)
    assert fast == slow
    assert [r.is_migrating for r in fast.running + fast.waiting] == [False, True, False, True]


@pytest.mark.parametrize("dst,expected", [
    (inst("d", running=[run("x", 50)]), "q"),                             # room 50 - 1 = 49: q (2 blocks) starts
    (inst("d", running=[run("x", 50)], waiting=[wait("y", 47 * 16)]), "q"),  # room 49 - 47 = 2: just fits
    (inst("d", running=[run("x", 50)], waiting=[wait("y", 48 * 16)]), "short"),  # room 1: q would queue again
    (None, "short"),                                                      # destination unknown: no queued move
])
def test_queued_moves_fits_reads_the_destination(dst, expected):
    src = inst("engine-id", running=[run("short", 3, 40), run("long", 60, 900)], waiting=[wait("q", 32)])
    assert llumlet(src, queued_moves="fits").select_requests_to_migrate(0.0, 1, dst) == [expected]
    # the paper's rule moves q (32 tokens, the shortest) wherever it goes
    assert llumlet(src).select_requests_to_migrate(0.0, 1, dst) == ["q"]


@pytest.mark.parametrize("dst,expected", [
    (inst("d", running=[run("x", 50)]), ["q"]),                     # (50 - 2) / 2 = 24 >= 5
    (inst("d", running=[run(f"x{k}", 22) for k in range(4)]), []),  # (12 - 2) / 5 = 2 < 5: it would become a source
    (None, ["q"]),                                                  # destination unknown: the pick stands
])
def test_stable_pairing_stops_a_move_that_would_make_the_destination_a_source(dst, expected):
    src = inst("engine-id", running=[run("short", 3, 40), run("long", 60, 900)], waiting=[wait("q", 32)])
    ll = llumlet(src, pairing="stable")
    assert ll.reads_destination
    assert ll.select_requests_to_migrate(0.0, 1, dst) == expected
    assert not llumlet(src).reads_destination


@pytest.mark.parametrize("dst,term,expected", [
    (inst("d", running=[run("x", 50)]), False, ["short"]),                   # (50 - 3) / 2 = 23.5 > 1
    (inst("d", total=20, running=[run("x", 4), run("y", 4)]), False, ["short"]),  # (12 - 3) / 3 = 3 > 1
    (inst("d", total=14, running=[run("x", 4), run("y", 4)]), False, []),    # room 4, but (6 - 3) / 3 = 1
    (inst("d", total=14, running=[run("x", 4), run("y", 4)]), True, ["short"]),  # a drain moves it anyway
    (None, False, ["short"]),                                                # destination unknown
])
def test_even_pairing_stops_a_chain_move_that_leaves_the_destination_no_freer_than_the_source(dst, term, expected):
    # the source: (100 - 3 - 94) / 3 = 1
    src = inst("engine-id", running=[run("short", 3, 40), run("long", 47, 900), run("long2", 47, 901)])
    ll = llumlet(src, pairing="even")
    ll.is_terminating = term
    assert ll.reads_destination
    assert ll.select_requests_to_migrate(0.0, 1, dst) == expected


def test_push_carries_the_prefix_keys_evicted_since_the_last_push_and_report_does_not_take_them():
    eng = make_engine(num_blocks=6, block_size=4, prefix_caching=True)
    lm = Llumlet("i0", eng, ReschedulingConfig(), NO_HEADROOM)
    eng.add_request("a", list(range(9)), SamplingParams(max_tokens=1, temperature=0.0))
    eng.step()  # a's prefill keys 2 blocks, and a finishes: they stay cached
    assert lm.push(0.1).evicted_prefix_keys == ()
    eng.add_request("b", list(range(100, 121)), SamplingParams(max_tokens=1, temperature=0.0))
    eng.step()  # b takes 6 blocks: both of a's cached ones are evicted
    assert lm.report(0.2).evicted_prefix_keys == ()  # a plain report leaves them for the push
    assert set(lm.push(0.2).evicted_prefix_keys) == set(eng.kv.prefix_keys(list(range(9))))
    assert lm.push(0.3).evicted_prefix_keys == ()


@pytest.mark.parametrize("dst,expected", [
    (inst("d", running=[run("x", 50)]), ["short"]),            # room 100 - 50 - 1 - 1 = 48: the paper's pick
    (inst("d", total=10, running=[run("x", 5)]), ["short"]),   # room 10 - 5 - 1 - 1 = 3 = short's 3 blocks
    (inst("d", total=10, running=[run("x", 6)]), []),          # room 2: neither short (3) nor long (60) fits
    (None, ["short"]),                                         # destination unknown: the pick stands
])
def test_a_chain_never_picks_a_running_request_the_destination_cannot_reserve(dst, expected):
    # issue 32: a fifth of the migrations started on an H200 were refused at reservation
    src = inst("engine-id", running=[run("short", 3, 40), run("long", 60, 900)])
    assert llumlet(src).select_requests_to_migrate(0.0, 1, dst) == expected


def test_a_request_about_to_end_is_not_migrated():
    # issue 45: a migration lasts at least its stages' decode steps; a request with fewer
    # tokens left than min_tokens_left would end first (aborted source_finished)
    eng = make_engine(num_blocks=32, block_size=4)
    for rid, max_tokens in (("ending", 3), ("short-prompt-ending", 2), ("long", 40)):
        eng.add_request(rid, list(range(1, 5 if rid != "long" else 9)), SamplingParams(max_tokens=max_tokens))
    eng.step()  # every prefill done, one token each
    paper = Llumlet("i0", eng, ReschedulingConfig(), FreenessConfig())
    assert paper.select_requests_to_migrate(1.0, 5) == ["ending", "short-prompt-ending", "long"]
    wary = Llumlet("i0", eng, ReschedulingConfig(min_tokens_left=2), FreenessConfig())
    assert wary.select_requests_to_migrate(1.0, 5) == ["ending", "long"]  # 2 - 1 = 1 left < 2
    assert Llumlet("i0", eng, ReschedulingConfig(min_tokens_left=3), FreenessConfig()).select_requests_to_migrate(
        1.0, 5) == ["long"]
    assert eng.running_near_end(3) == {"ending", "short-prompt-ending"}


def test_min_tokens_left_is_checked():
    with pytest.raises(Exception, match="min_tokens_left"):
        ReschedulingConfig(min_tokens_left=-1)


def test_push_is_report_plus_the_evicted_keys():
    """``push`` writes ``report``'s call out (speed): it must carry every field alike."""
    import dataclasses

    eng = make_engine(num_blocks=32, block_size=4)
    lm = Llumlet("i3", eng, ReschedulingConfig(), NO_HEADROOM)
    for rid in ("a", "b"):
        eng.add_request(rid, list(range(9)), SamplingParams(max_tokens=8, temperature=0.0))
    eng.step()
    lm.is_terminating, lm.is_schedulable = True, False
    lm.on_migration_started("a")
    pushed, reported = lm.push(0.5), lm.report(0.5)
    assert dataclasses.asdict(pushed) == dataclasses.asdict(reported)
    assert (pushed.num_migrating_out, pushed.is_terminating, pushed.is_schedulable) == (1, True, False)
    assert [r.is_migrating for r in pushed.running] == [True, False]
