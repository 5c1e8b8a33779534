"""Table-driven tests of every policy rule over literal snapshots."""
from __future__ import annotations

import math

import pytest

from llumnix.core.status import InstanceStatus, RequestBrief
from llumnix.policy import (
    DispatchContext,
    DispatchRequest,
    FreenessConfig,
    GlobalScheduler,
    PolicyConfigError,
    ReschedulingConfig,
    ScalingConfig,
    SchedulingConfig,
    freeness,
    make_pipeline,
    pair_migrations,
    scaling_decision,
    select_requests,
    virtual_usages,
)

NO_HEADROOM = FreenessConfig(headroom_tokens={})


def run(rid, blocks, tokens=None, prio=0, t=0.0, migrating=False):
    return RequestBrief(rid, prio, blocks, tokens if tokens is not None else blocks * 16, t, True, migrating)


def wait(rid, tokens, prio=0, t=0.0):
    return RequestBrief(rid, prio, 0, tokens, t, False)


def inst(iid, total=100, running=(), waiting=(), hol=None, ts=0.0, term=False, sched=True,
         reserved=0, mig_in=0, mig_out=0):
    used = sum(r.num_blocks for r in running) + reserved
    if hol is None:
        hol = -(-waiting[0].num_tokens // 16) if waiting else 0
    return InstanceStatus(iid, ts, total, used, 1, 16, 64, tuple(running), tuple(waiting), hol,
                          num_reserved_blocks=reserved, num_migrating_in=mig_in,
                          num_migrating_out=mig_out, is_terminating=term, is_schedulable=sched)


# -- virtual usage and freeness ------------------------------------------------
@pytest.mark.parametrize("status,cfg,expected", [
    # running: physical blocks
    (inst("a", running=[run("r1", 10), run("r2", 20)]), NO_HEADROOM, [10, 20]),
    # queued: head of line counts its demand (40 tokens -> 3 blocks), the rest 0
    (inst("a", running=[run("r1", 10)], waiting=[wait("q1", 40), wait("q2", 400)]), NO_HEADROOM,
     [10, 3, 0]),
    # high-priority headroom (1600 tokens = 100 blocks) shared among the 2 high requests
    (inst("a", running=[run("h1", 4, prio=1), run("h2", 6, prio=1), run("n", 5)]), FreenessConfig(),
     [54, 56, 5]),
    # terminating: a fake request of infinite usage
    (inst("a", running=[run("r1", 10)], term=True), NO_HEADROOM, [10, math.inf]),
])
def test_virtual_usage(status, cfg, expected):
    assert virtual_usages(status, cfg) == expected


@pytest.mark.parametrize("status,expected", [
    (inst("idle", total=100), 100.0),                                   # B = 0 divides by 1
    (inst("a", running=[run("r1", 10), run("r2", 30)]), 30.0),          # (100 - 40) / 2
    (inst("a", running=[run("r1", 50)], waiting=[wait("q", 800)]), 0.0),  # HOL demand 50
    (inst("a", running=[run("r1", 60)], waiting=[wait("q", 1600)]), -60.0),  # negative: overloaded
    (inst("a", running=[run("r1", 10)], reserved=20), 70.0),            # incoming reservations count
    (inst("a", running=[run("r1", 10)], term=True), -math.inf),
])
def test_freeness(status, expected):
    assert freeness(status, NO_HEADROOM) == expected


# -- dispatch ------------------------------------------------------------------
CLUSTER = [
    inst("i0", running=[run("a", 60), run("b", 20)]),                  # F = 10, 2 requests
    inst("i1", running=[run("c", 30)], waiting=[wait("q", 480)]),      # F = 40, memory 0.6
    inst("i2", running=[run("d", 10)] * 5),                             # F = 10, 5 requests
]


def ctx(now=0.0, sent=None, seed=0):
    import random
    return DispatchContext(now=now, freeness=NO_HEADROOM, staleness_s=2.0, sent=sent or {},
                           rng=random.Random(seed))


@pytest.mark.parametrize("policy,expected", [
    ("llumnix", "i1"),          # highest freeness
    ("infaas++", "i2"),         # lowest memory load counting all queued demand: 50/100
    ("least-requests", "i0"),   # 2 requests (ties broken by id)
    ("llm-d", "i2"),            # queue-depth 1 + kv 0.5 vs i0 (1 + 0.2) and i1 (0 + 0.7)
])
def test_dispatch_policies_choose_as_specified(policy, expected):
    assert make_pipeline(policy).pick(CLUSTER, ctx()) == expected


def test_round_robin_sends_to_the_instance_sent_the_fewest():
    assert make_pipeline("round-robin").pick(CLUSTER, ctx(sent={"i0": 3, "i1": 1, "i2": 1})) == "i1"


def test_random_and_power_of_two_are_seeded():
    picks = {make_pipeline("random").pick(CLUSTER, ctx(seed=s)) for s in range(30)}
    assert picks == {"i0", "i1", "i2"}
    p2 = make_pipeline("power-of-two")
    assert [p2.pick(CLUSTER, ctx(seed=s)) for s in range(10)] == [p2.pick(CLUSTER, ctx(seed=s)) for s in range(10)]
    assert "i2" not in {p2.pick(CLUSTER, ctx(seed=s)) for s in range(50)}  # i2 always loses its duel


@pytest.mark.parametrize("bad,expected", [
    (inst("i1", sched=False), "i0"),
    (inst("i1", term=True), "i0"),
    (inst("i1", ts=-10.0), "i0"),  # stale
])
def test_filters(bad, expected):
    statuses = [inst("i0", running=[run("a", 50)]), bad]
    assert make_pipeline("llumnix").pick(statuses, ctx()) == expected


def test_when_every_status_is_stale_the_freshness_filter_steps_aside():
    statuses = [inst("i0", running=[run("a", 50)], ts=-10), inst("i1", ts=-10)]
    assert make_pipeline("llumnix").pick(statuses, ctx()) == "i1"


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(PolicyConfigError, match="unknown dispatch policy 'nope'"):
        make_pipeline("nope")
    with pytest.raises(PolicyConfigError, match="rescheduling.bogus"):
        SchedulingConfig.from_dict({"rescheduling": {"bogus": 1}})


def test_dispatch_burst_between_reports_spreads_across_instances():
    gs = GlobalScheduler(SchedulingConfig(freeness=NO_HEADROOM))
    for i in range(4):
        gs.add_instance(inst(f"i{i}", total=100))
    chosen = [gs.dispatch(DispatchRequest(f"r{k}", 160), now=0.01) for k in range(8)]
    assert sorted(chosen) == ["i0", "i0", "i1", "i1", "i2", "i2", "i3", "i3"]
    # a fresh report that includes the requests replaces the pending estimate
    gs.update_status(inst("i0", total=100, running=[run("r0", 10), run("r4", 10)], ts=0.02))
    assert len(gs.view()[0].running) == 2


# -- pairing -------------------------------------------------------------------
def test_pairing_lowest_with_highest_within_thresholds_and_caps():
    st = [inst("busy", running=[run(f"r{i}", 19) for i in range(5)]),            # F = 1
          inst("full", running=[run(f"r{i}", 24) for i in range(4)]),            # F = 1
          inst("mid", running=[run("m", 50)]),                                   # F = 50
          inst("empty"),                                                          # F = 100
          inst("capped", mig_in=1)]                                               # F = 100, at max_in
    cfg = ReschedulingConfig(out_threshold=3, in_threshold=3)
    orders = pair_migrations(st, cfg, NO_HEADROOM)
    assert [(o.src_instance_id, o.dst_instance_id) for o in orders] == [("busy", "empty"), ("full", "mid")]


def test_terminating_instance_is_always_a_source_never_a_destination():
    st = [inst("going", running=[run("r", 5)], term=True), inst("stay", running=[run("s", 5)])]
    orders = pair_migrations(st, ReschedulingConfig(), NO_HEADROOM)
    assert [(o.src_instance_id, o.dst_instance_id) for o in orders] == [("going", "stay")]


# -- request selection ------------------------------------------------------------
SRC = inst("s", running=[run("long", 30, 480), run("short", 2, 20), run("hi", 1, 10, prio=1),
                         run("moving", 1, 5, migrating=True)],
           waiting=[wait("q-late", 50, t=2.0), wait("q-early", 300, t=1.0)])


@pytest.mark.parametrize("policy,expected", [
    ("paper", ["short", "q-late", "q-early", "long", "hi"]),  # normal before high, then shorter
    ("SR", ["short", "long", "hi"]),
    ("LR", ["long", "short", "hi"]),
    ("FCW", ["q-early", "q-late"]),
])
def test_selection(policy, expected):
    assert select_requests(SRC, policy, max_n=10) == expected


def test_high_priority_only_when_nothing_else():
    only_hi = inst("s", running=[run("hi", 1, prio=1)])
    assert select_requests(only_hi, "paper") == ["hi"]
    assert select_requests(SRC, "paper", max_n=1, exclude={"short", "q-late", "q-early", "long"}) == ["hi"]


# -- scaling --------------------------------------------------------------------
@pytest.mark.parametrize("samples,n,expected", [
    ([(0, 5.0), (5, 6.0), (10, 7.0)], 2, "out"),
    ([(0, 80.0), (5, 90.0), (10, 70.0)], 2, "in"),
    ([(0, 80.0), (5, 90.0), (10, 70.0)], 1, "none"),   # at min_instances
    ([(0, 30.0), (10, 30.0)], 2, "none"),
    ([(6, 5.0), (10, 5.0)], 2, "none"),                # not a full window yet
])
def test_scaling_decision(samples, n, expected):
    cfg = ScalingConfig(enabled=True, window_s=10, cooldown_s=0, min_instances=1, max_instances=4)
    statuses = [inst("a", running=[run("x", 5)] * 3), inst("b", running=[run("y", 5)])][:n]
    act = scaling_decision(samples, statuses, cfg, now=10.0, last_action_time=None)
    assert act.kind == expected
    if expected == "in":
        assert act.instance_id == "b"  # the instance with the fewest requests drains


def test_scaling_cooldown():
    cfg = ScalingConfig(enabled=True, window_s=10, cooldown_s=30)
    act = scaling_decision([(0, 1.0), (10, 1.0)], [inst("a")], cfg, now=10.0, last_action_time=0.0)
    assert act.kind == "none"
