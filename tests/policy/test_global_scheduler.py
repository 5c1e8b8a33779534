"""GlobalScheduler: dispatch storms spread, pending estimates, membership, rounds, scaling."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from llumnix.policy import (
    DispatchContext,
    DispatchRequest,
    GlobalScheduler,
    MigrationOrder,
    SchedulingConfig,
    make_pipeline,
)
from tests.policy.snapshots import inst, run, wait


def gs_with(policy="llumnix", n=4, migration=True, grace=0.0, scaling=None, **kw):
    cfg = SchedulingConfig.from_dict({
        "freeness": {"headroom_tokens": {}},
        "dispatch": {"policy": policy, "pending_grace_s": grace},
        "rescheduling": {"enabled": migration},
        "scaling": scaling or {},
    })
    gs = GlobalScheduler(cfg, **kw)
    for i in range(n):
        gs.add_instance(inst(f"i{i}"))
    return gs


def burst(gs, n, tokens=160, now=0.01, prio=0):
    return [gs.dispatch(DispatchRequest(f"r{k}", tokens, prio, now), now) for k in range(n)]


def test_without_pending_estimates_a_burst_lands_on_one_instance():
    statuses = [inst(f"i{i}") for i in range(4)]
    ctx = DispatchContext(now=0.0, freeness=gs_with().config.freeness, staleness_s=2.0, rng=random.Random(0))
    assert {make_pipeline("llumnix").pick(statuses, ctx) for _ in range(8)} == {"i0"}


@pytest.mark.parametrize("policy", ["llumnix", "infaas++", "least-requests", "llm-d", "round-robin"])
def test_a_burst_between_two_reports_spreads_evenly(policy):
    gs = gs_with(policy)
    assert Counter(burst(gs, 8)) == {"i0": 2, "i1": 2, "i2": 2, "i3": 2}


def test_power_of_two_spreads_a_burst_too():
    counts = Counter(burst(gs_with("power-of-two", seed=3), 40))
    assert len(counts) == 4 and max(counts.values()) - min(counts.values()) <= 4


def test_pending_requests_count_their_blocks_and_batch_slot():
    gs = gs_with(n=1)
    burst(gs, 2, tokens=170)  # 11 blocks each
    (view,) = gs.view()
    assert view.num_running == 2 and view.num_used_blocks == 22
    assert gs.pending.num_pending("i0") == 2


@pytest.mark.parametrize("report,grace,left", [
    # the report shows the request (running or queued): the engine's own count replaces the estimate
    (inst("i0", running=[run("r0", 10)], ts=0.02), 0.0, 0),
    (inst("i0", waiting=[wait("r0", 160)], ts=0.02), 5.0, 0),
    # a report from before the dispatch cannot know it
    (inst("i0", ts=0.0), 0.0, 1),
    # a later report that does not show it: still in transit within the grace...
    (inst("i0", ts=0.5), 1.0, 1),
    # ...and assumed finished or lost after it
    (inst("i0", ts=1.5), 1.0, 0),
    (inst("i0", ts=0.02), 0.0, 0),
])
def test_pending_estimate_lasts_until_a_report_accounts_for_it(report, grace, left):
    gs = gs_with(n=1, grace=grace)
    burst(gs, 1)
    gs.update_status(report)
    assert gs.pending.num_pending("i0") == left


def test_a_request_seen_finishing_stops_counting_at_once():
    """A gateway sees a request's last output (with the report sent beside it): the
    estimate goes then, not a grace period later, and only that request's."""
    gs = gs_with(n=1, grace=1.0)
    burst(gs, 3, tokens=170)  # 11 blocks each
    gs.update_status(inst("i0", ts=0.5))  # shows none of them, within the grace
    gs.on_finished("i0", "r1")
    gs.on_finished("i0", "nope")  # not pending here: nothing changes
    (view,) = gs.view()
    assert gs.pending.num_pending("i0") == 2
    assert view.num_running == 2 and view.num_used_blocks == 22


def test_burst_after_a_report_is_judged_on_fresh_freeness():
    gs = gs_with(n=2)
    gs.update_status(inst("i0", running=[run("big", 90)], ts=0.005))  # F(i0) = 10, F(i1) = 100
    assert burst(gs, 3) == ["i1", "i1", "i1"]  # i1 after 3 x 10 blocks: (100 - 30) / 3 = 23 > 10
    assert gs.sent == {"i0": 0, "i1": 3}


def test_the_first_report_of_an_unknown_instance_adds_it():
    gs = gs_with(n=0)
    gs.update_status(inst("new", ts=1.0))
    assert gs.dispatch(DispatchRequest("r", 16), 1.0) == "new"


def test_late_reports_never_roll_the_view_back():
    gs = gs_with(n=1)
    gs.update_status(inst("i0", running=[run("a", 50)], ts=2.0))
    gs.update_status(inst("i0", ts=1.0))
    assert gs.statuses["i0"].num_running == 1


def test_mark_terminating_stops_dispatch_and_makes_a_source_until_removed():
    gs = gs_with(n=2)
    gs.update_status(inst("i0", running=[run("a", 5)], ts=0.1))
    gs.mark_terminating("i0")
    gs.update_status(inst("i0", running=[run("a", 5)], ts=0.2))  # its own report does not know yet
    assert gs.statuses["i0"].is_terminating
    assert burst(gs, 3, now=0.3) == ["i1"] * 3
    assert gs.reschedule(0.3) == [MigrationOrder("i0", "i1")]
    gs.remove_instance("i0")
    assert list(gs.statuses) == ["i1"] and "i0" not in gs.sent
    gs.update_status(inst("i0", ts=0.4))  # a late report does not resurrect it
    assert list(gs.statuses) == ["i1"]
    gs.add_instance(inst("i0"))  # the same id may come back as a fresh instance
    assert not gs.statuses["i0"].is_terminating


def test_no_instance_to_dispatch_to():
    gs = gs_with(n=1)
    gs.mark_terminating("i0")
    assert gs.dispatch(DispatchRequest("r", 16), 0.0) is None
    assert gs_with(n=0).dispatch(DispatchRequest("r", 16), 0.0) is None


def test_reschedule_pairs_only_when_migration_is_enabled():
    for enabled, expected in [(True, [MigrationOrder("i0", "i1")]), (False, [])]:
        gs = gs_with(n=2, migration=enabled)
        gs.update_status(inst("i0", running=[run(f"r{k}", 19) for k in range(5)], ts=0.1))
        assert gs.reschedule(0.1) == expected


def test_statuses_live_in_any_mapping_the_caller_provides():
    class Store(dict):
        writes = 0

        def __setitem__(self, key, value):
            Store.writes += 1
            super().__setitem__(key, value)

    store = Store()
    gs = gs_with(n=2, store=store)
    gs.update_status(inst("i1", running=[run("a", 5)], ts=1.0))
    assert set(store) == {"i0", "i1"} and Store.writes == 3 and gs.statuses is store


def test_scaling_in_over_a_window_of_idle_instances_then_cooldown():
    gs = gs_with(n=2, scaling={"enabled": True, "window_s": 2, "cooldown_s": 5})
    gs.update_status(inst("i1", running=[run("a", 5)], ts=0.0))
    decisions = []
    for t in range(0, 10):
        gs.record_freeness(float(t))  # (100 + 95) / 2 > 60
        decisions.append(gs.scaling_decision(float(t)).kind)
    # a full window at t=2; the action restarts the window and the cooldown runs until t=7
    assert decisions == ["none", "none", "in", "none", "none", "none", "none", "in", "none", "none"]


def test_scaling_in_picks_the_instance_with_fewest_running():
    gs = gs_with(n=2, scaling={"enabled": True, "window_s": 1, "cooldown_s": 0})
    gs.update_status(inst("i0", running=[run("a", 5)], ts=0.0))
    for t in (0.0, 1.0):
        gs.record_freeness(t)
    act = gs.scaling_decision(1.0)
    assert (act.kind, act.instance_id) == ("in", "i1")


def test_after_a_scale_out_nothing_more_until_the_new_instance_is_added():
    gs = gs_with(n=1, scaling={"enabled": True, "window_s": 1, "cooldown_s": 0})
    gs.update_status(inst("i0", running=[run(f"r{k}", 19) for k in range(5)], ts=0.0))  # F = 1
    kinds = []
    for t in range(6):
        gs.record_freeness(float(t))
        kinds.append(gs.scaling_decision(float(t)).kind)
        if t == 3:
            gs.add_instance(inst("i1", running=[run(f"s{k}", 19) for k in range(5)], ts=3.0))
    assert kinds == ["none", "out", "none", "none", "none", "out"] and gs.num_starting == 1
    gs.on_scale_out_failed()
    assert gs.num_starting == 0


@pytest.mark.parametrize("policy", ["llumnix", "infaas++"])
def test_cached_scores_follow_every_new_report(policy):
    """Scores are cached per status object: a new report of the same instance (same id,
    new numbers) must be scored afresh, and a dispatch must see its own pending request."""
    gs = gs_with(policy, n=2)
    gs.update_status(inst("i0", ts=1.0, running=[run("a", 90)]))   # i0 nearly full
    gs.update_status(inst("i1", ts=1.0))
    assert gs.dispatch(DispatchRequest("x", 16, 0, 1.0), 1.0) == "i1"
    gs.update_status(inst("i0", ts=2.0))                            # i0 empties
    gs.update_status(inst("i1", ts=2.0, running=[run("b", 90)]))    # i1 fills
    assert gs.dispatch(DispatchRequest("y", 16, 0, 2.0), 2.0) == "i0"
    # The pending request y now weighs on i0's view; a big one goes to i1 only if it is
    # freer, so compare against a fresh scheduler that saw the same history without caches.
    fresh = gs_with(policy, n=2)
    for s in gs.statuses.values():
        fresh.update_status(s)
    fresh.cluster.pending = gs.pending
    assert gs.dispatch(DispatchRequest("z", 16, 0, 2.0), 2.0) == fresh.pipeline.pick(
        fresh.view(), DispatchContext(now=2.0, freeness=fresh.config.freeness, staleness_s=2.0))


# A burst of mixed prompts onto two 32-block instances, the engines reporting every 6
# dispatches what they would hold: FCFS admission while blocks last, the rest queued.
BURST_PROMPTS = [300, 40, 40, 40, 250, 60, 40, 200, 40, 40, 180, 40, 60, 40, 220, 40, 40, 40, 160, 40, 40, 40, 40, 40]


def _engine_report(iid, sent, now, total=32):
    running, waiting, used = [], [], 0
    for rid, tokens in sent:
        blocks = -(-tokens // 16)
        if not waiting and used + blocks <= total - 1:
            running.append(run(rid, blocks, tokens))
            used += blocks
        else:
            waiting.append(wait(rid, tokens))
    return inst(iid, total=total, running=running, waiting=waiting, ts=now)


def _play_burst(policy, params=None):
    cfg = SchedulingConfig.from_dict({"freeness": {"headroom_tokens": {}},
                                      "dispatch": {"policy": policy, "params": params or {}, "pending_grace_s": 1.0}})
    gs = GlobalScheduler(cfg)
    sent = {"i0": [], "i1": []}
    for iid in sent:
        gs.add_instance(_engine_report(iid, [], 0.0))
    for k, tokens in enumerate(BURST_PROMPTS):
        now = 0.001 * (k + 1)
        if k and k % 6 == 0:
            for iid, reqs in sent.items():
                gs.update_status(_engine_report(iid, reqs, now))
        sent[gs.dispatch(DispatchRequest(f"r{k}", tokens, 0, now), now)].append((f"r{k}", tokens))
    blocks = [sum(-(-t // 16) for _, t in reqs) for reqs in sent.values()]
    return abs(blocks[0] - blocks[1]), abs(len(sent["i0"]) - len(sent["i1"]))


@pytest.mark.parametrize("policy,params,max_block_gap,max_count_gap", [
    ("round-robin", {}, 46, 0),           # even counts, 93 against 47 blocks
    ("infaas++", {}, 2, 0),
    ("llumnix", {}, 4, 2),                # the whole queue counts, a deficit times B (issue 32)
])
def test_a_burst_reported_as_it_lands_spreads_blocks_not_only_counts(policy, params, max_block_gap, max_count_gap):
    block_gap, count_gap = _play_burst(policy, params)
    assert block_gap <= max_block_gap and count_gap <= max_count_gap
