"""Each dispatch policy's choice on literal tables; filters, fallback, pickers, ordering."""
from __future__ import annotations

import random

import pytest

from llumnix.policy import (
    DispatchContext,
    DispatchQueue,
    DispatchRequest,
    FreenessConfig,
    Pipeline,
    PolicyConfigError,
    make_pipeline,
)
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait

#            freeness  memory load  requests  queue  kv used
# i0         10        0.8          2         0      0.8
# i1         40        0.6          2         1      0.3
# i2         10        0.5          5         0      0.5
CLUSTER = [
    inst("i0", running=[run("a", 60), run("b", 20)]),
    inst("i1", running=[run("c", 30)], waiting=[wait("q", 480)]),
    inst("i2", running=[run(f"d{k}", 10) for k in range(5)]),
]
# With the default headroom the lone high-priority request makes hi's freeness -10.
PRIORITY_CLUSTER = [
    inst("hi", running=[run("h", 10, prio=1)]),
    inst("lo", running=[run("n1", 40), run("n2", 40)]),
]

#        freeness (head)         queue-aware freeness
# qa     (100 - 40 - 10) / 1     (100 - 40 - 30) / 4
# qb     (100 - 40) / 2          (100 - 40) / 2
QUEUE_CLUSTER = [
    inst("qa", running=[run("r", 40)], waiting=[wait(f"q{k}", 160) for k in range(3)]),
    inst("qb", running=[run("s1", 20), run("s2", 20)]),
]


def ctx(now=0.0, sent=None, seed=0, fcfg=NO_HEADROOM, staleness=2.0):
    return DispatchContext(now=now, freeness=fcfg, staleness_s=staleness, sent=sent or {},
                           rng=random.Random(seed))


@pytest.mark.parametrize("policy,params,statuses,fcfg,expected", [
    ("llumnix", {}, CLUSTER, NO_HEADROOM, "i1"),                   # highest freeness
    ("infaas++", {}, CLUSTER, NO_HEADROOM, "i2"),                  # lowest memory load, whole queue counted
    ("infaas++", {"metric": "freeness"}, CLUSTER, NO_HEADROOM, "i1"),  # the Llumnix metric, no migration
    ("least-requests", {}, CLUSTER, NO_HEADROOM, "i0"),            # 2 requests; tie i0/i1 -> lowest id
    ("llm-d", {}, CLUSTER, NO_HEADROOM, "i2"),                     # queue 1 + kv .5 beats 1 + .2 and 0 + .7
    ("llm-d", {"queue_weight": 0, "kv_weight": 1}, CLUSTER, NO_HEADROOM, "i1"),  # kv alone: least used
    ("llm-d", {"queue_weight": 1, "kv_weight": 0}, CLUSTER, NO_HEADROOM, "i0"),  # queue alone: tie -> id
    ("llumnix", {"queued": "head"}, QUEUE_CLUSTER, NO_HEADROOM, "qa"),  # Algorithm 1: only the head counts
    ("llumnix", {"queued": "all"}, QUEUE_CLUSTER, NO_HEADROOM, "qb"),  # the whole queue counts
    ("llumnix", {}, QUEUE_CLUSTER, NO_HEADROOM, "qb"),              # ... by default (issue 32)
    ("llumnix", {}, PRIORITY_CLUSTER, FreenessConfig(), "lo"),     # headroom keeps normal load away
    ("llumnix", {}, PRIORITY_CLUSTER, NO_HEADROOM, "hi"),
    ("infaas++", {}, PRIORITY_CLUSTER, FreenessConfig(), "hi"),    # INFaaS++ knows no headroom
    ("custom", {"scorers": [{"name": "memory-load", "weight": 2}]}, CLUSTER, NO_HEADROOM, "i2"),
])
def test_dispatch_policies_choose_as_specified(policy, params, statuses, fcfg, expected):
    assert make_pipeline(policy, params).pick(statuses, ctx(fcfg=fcfg)) == expected


@pytest.mark.parametrize("sent,expected", [
    ({}, "i0"),                                  # nobody sent anything: lowest id
    ({"i0": 1}, "i1"),
    ({"i0": 1, "i1": 1}, "i2"),
    ({"i0": 3, "i1": 1, "i2": 1}, "i1"),         # fewest sent, whatever the load
])
def test_round_robin_sends_to_the_instance_sent_the_fewest(sent, expected):
    assert make_pipeline("round-robin").pick(CLUSTER, ctx(sent=sent)) == expected


def test_random_is_seeded_and_covers_every_candidate():
    rnd = make_pipeline("random")
    assert {rnd.pick(CLUSTER, ctx(seed=s)) for s in range(30)} == {"i0", "i1", "i2"}
    assert [rnd.pick(CLUSTER, ctx(seed=s)) for s in range(10)] == [rnd.pick(CLUSTER, ctx(seed=s)) for s in range(10)]


def test_power_of_two_picks_the_less_loaded_of_two_random_candidates():
    p2 = make_pipeline("power-of-two")
    picks = [p2.pick(CLUSTER, ctx(seed=s)) for s in range(50)]
    assert picks == [p2.pick(CLUSTER, ctx(seed=s)) for s in range(50)]
    assert set(picks) == {"i0", "i1"}  # i2 (5 requests) loses every duel
    assert p2.pick(CLUSTER[2:], ctx()) == "i2"  # one candidate: no duel


@pytest.mark.parametrize("tie_break,expected", [("id", {"a"}), ("random", {"a", "b"})])
def test_ties_break_by_lowest_id_or_by_the_rng(tie_break, expected):
    twins = [inst("b", running=[run("x", 10)]), inst("a", running=[run("y", 10)])]
    p = make_pipeline("llumnix", {"tie_break": tie_break})
    assert {p.pick(twins, ctx(seed=s)) for s in range(20)} == expected


@pytest.mark.parametrize("other,expected", [
    (inst("i1", sched=False), "i0"),
    (inst("i1", term=True), "i0"),
    (inst("i1", ts=-2.5), "i0"),                 # older than now - staleness: dropped
    (inst("i1", ts=-2.0), "i1"),                 # exactly at the staleness bound: kept
])
def test_filters_drop_unschedulable_terminating_and_stale(other, expected):
    statuses = [inst("i0", running=[run("a", 50)]), other]
    assert make_pipeline("llumnix").pick(statuses, ctx()) == expected


@pytest.mark.parametrize("statuses,expected", [
    # every status stale: the staleness filter steps aside (documented fallback)
    ([inst("i0", running=[run("a", 50)], ts=-10), inst("i1", ts=-10)], "i1"),
    # a stale one survives when the fresh one is terminating
    ([inst("i0", term=True), inst("i1", running=[run("a", 50)], ts=-10)], "i1"),
    # the hard filters are never relaxed: nothing to dispatch to
    ([inst("i0", term=True), inst("i1", sched=False)], None),
    ([], None),
])
def test_when_filters_leave_nothing(statuses, expected):
    assert make_pipeline("llumnix").pick(statuses, ctx()) == expected


def test_scores_are_clamped_and_weighted_by_the_framework():
    p = Pipeline(scorers=(("kv-utilization", 2.0), ("queue-depth", 0.5)))
    assert p.scores(CLUSTER, ctx()) == pytest.approx([2 * 0.2 + 0.5, 2 * 0.7 + 0.0, 2 * 0.5 + 0.5])


@pytest.mark.parametrize("name,params,field", [
    ("nope", {}, "dispatch.policy"),
    ("llumnix", {"bogus": 1}, "dispatch.params.bogus"),
    ("random", {"tie_break": "id"}, "dispatch.params.tie_break"),
    ("llumnix", {"tie_break": "coin"}, "dispatch.params.tie_break"),
    ("infaas++", {"metric": "vibes"}, "dispatch.params.metric"),
    ("llumnix", {"queued": "some"}, "dispatch.params.queued"),
    ("llm-d", {"kv_weight": "heavy"}, "dispatch.params.kv_weight"),
    ("custom", {"scorers": [{"name": "no-such-scorer"}]}, "scorer"),
    ("custom", {"filters": ["no-such-filter"]}, "filter"),
    ("custom", {"picker": "no-such-picker"}, "picker"),
    ("custom", {"scorers": [{"name": "freeness", "weight": -1}]}, "weight"),
])
def test_bad_policy_configuration_is_a_clear_error(name, params, field):
    with pytest.raises(PolicyConfigError) as e:
        make_pipeline(name, params)
    assert e.value.param == field


def test_dispatch_queue_orders_by_priority_then_arrival():
    q = DispatchQueue()
    for rid, prio, t in [("n-late", 0, 3.0), ("h-late", 1, 2.0), ("n-early", 0, 1.0), ("h-early", 1, 2.0),
                         ("n-tie", 0, 1.0)]:
        q.push(DispatchRequest(rid, 16, prio, t))
    order = ["h-late", "h-early", "n-early", "n-tie", "n-late"]  # equal keys: push order
    assert [r.request_id for r in q] == order and len(q) == 5
    assert q.peek().request_id == "h-late"
    assert [q.pop().request_id for _ in range(5)] == order
