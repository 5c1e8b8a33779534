"""Triggered rescheduling (policy/trigger.py): marks by the pairing's own tests, triggers
on marks that appear, reaction times, and the pass timer."""
from __future__ import annotations

import pytest

from llumnix.policy import ReschedulingConfig
from llumnix.policy.pairing import pair_migrations
from llumnix.policy.trigger import Marks, PassTimer, Reactions, marks_of, should_trigger
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait

CFG = ReschedulingConfig(out_threshold=3.0, in_threshold=10.0)
S, B, D, N = Marks.SOURCE, Marks.BLOCKED, Marks.DESTINATION, Marks.NONE


@pytest.mark.parametrize("status,expected", [
    (inst("i"), D),                                                     # idle: F = 100
    (inst("i", running=[run("a", 50)]), D),                             # F = 50
    (inst("i", running=[run("a", 40), run("b", 52)]), N),               # F = 4: neither
    (inst("i", running=[run("a", 98)]), S),                             # F = 2
    (inst("i", running=[run("a", 98)], mig_out=1), N),                  # at max_out: pairing skips it
    (inst("i", running=[run("a", 98, migrating=True)]), N),             # nothing to give up
    (inst("i", running=[run("a", 10)], term=True), S),                  # draining: a source, never a destination
    (inst("i", running=[run("a", 90)], waiting=[wait("w", 20 * 16)]), S | B),  # HOL needs 20, 9 free
    (inst("i", sched=False), N),                                        # unhealthy: no destination
    (inst("i", mig_in=1), N),                                           # at max_in
])
def test_marks_are_the_pairings_own_tests(status, expected):
    assert marks_of(status, CFG, NO_HEADROOM) == expected


def test_a_source_mark_is_what_pairing_makes_a_source():
    src, dst = inst("s", running=[run("a", 98), run("b", 1)]), inst("d")
    assert marks_of(src, CFG, NO_HEADROOM) & S and marks_of(dst, CFG, NO_HEADROOM) & D
    [order] = pair_migrations([src, dst], CFG, NO_HEADROOM)
    assert (order.src_instance_id, order.dst_instance_id) == ("s", "d")


@pytest.mark.parametrize("old,new,wanting,fires", [
    (N, S, True, True),
    (N, B, True, True),
    (S, S | B, True, True),      # blocked too: a pass may now move the head of line
    (S, S, True, False),         # still a source: the sweep retries, not every status
    (S, N, False, False),
    (N, D, False, False),        # a destination nobody waits for
    (N, D, True, True),
    (D, D, True, False),
])
def test_only_a_mark_that_appears_triggers(old, new, wanting, fires):
    assert should_trigger(old, new, wanting) is fires


def test_reactions_trigger_once_per_new_source_and_time_the_first_order():
    r = Reactions(CFG, NO_HEADROOM)
    assert not r.on_status(inst("d", ts=0.0))                            # a destination, no source
    assert not r.on_status(inst("s", running=[run("a", 40)], ts=0.0))
    assert r.on_status(inst("s", running=[run("a", 98)], ts=1.0))        # becomes a source
    assert not r.on_status(inst("s", running=[run("a", 99)], ts=1.05))   # stays one
    assert r.on_order("s", "d", 1.03) == pytest.approx(0.03)
    assert r.on_order("s", "d", 1.5) is None                             # only the first order
    assert not r.on_status(inst("s", running=[run("a", 99)], mig_out=1, ts=1.1))
    assert r.on_status(inst("s", running=[run("a", 99)], ts=2.0))        # chain over, still a source
    assert r.on_order("s", "d", 2.01) == pytest.approx(0.01)
    assert r.num_triggers == 2


def test_a_reaction_runs_from_the_destination_when_the_source_waited_for_one():
    r = Reactions(CFG, NO_HEADROOM)
    assert r.on_status(inst("s", running=[run("a", 98)], ts=1.0))
    assert not r.on_status(inst("d", running=[run("a", 95)], ts=1.0))
    assert r.on_status(inst("d", ts=5.0))                                # the source waits: fires
    assert r.on_order("s", "d", 5.02) == pytest.approx(0.02)


def test_a_source_that_recovers_or_leaves_is_no_longer_timed():
    r = Reactions(CFG, NO_HEADROOM)
    r.on_status(inst("s", running=[run("a", 98)], ts=1.0))
    r.on_status(inst("s", running=[run("a", 20)], ts=1.2))
    assert r.on_order("s", "d", 1.3) is None
    r.on_status(inst("t", running=[run("a", 98)], ts=1.0))
    r.remove("t")
    assert r.on_order("t", "d", 1.3) is None and "t" not in r.marks
    assert not r.on_status(inst("d", ts=2.0))                           # nobody waits any more


def test_the_timer_spaces_triggered_passes_and_keeps_the_sweep():
    t = PassTimer(sweep_interval_s=0.5, min_gap_s=0.03)
    t.start(10.0)
    assert t.due(10.0) is None and t.wait_s(10.0) == pytest.approx(0.5)
    t.on_trigger()
    assert t.due(10.0) == "pass" and t.wait_s(10.0) == 0.0
    t.ran("pass", 10.0)
    t.on_trigger()                                        # a second trigger right after
    assert t.due(10.01) is None and t.wait_s(10.01) == pytest.approx(0.02)
    assert t.due(10.03) == "pass"
    t.ran("pass", 10.03)
    assert t.due(10.2) is None and t.wait_s(10.2) == pytest.approx(0.3)
    assert t.due(10.5) == "sweep"
    t.on_trigger()
    t.ran("sweep", 10.5)                                  # a sweep answers the trigger
    assert t.due(10.6) is None and t.wait_s(10.6) == pytest.approx(0.4)


def test_without_a_gap_only_the_periodic_round_runs():
    t = PassTimer(sweep_interval_s=0.5, min_gap_s=None)
    t.start(0.0)
    t.on_trigger()
    assert t.due(0.1) is None and t.wait_s(0.1) == pytest.approx(0.4)
    assert t.due(0.5) == "sweep"


def test_a_negative_gap_is_refused_with_its_field_named():
    from llumnix.policy import SchedulingConfig
    from llumnix.policy.config import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="rescheduling.trigger_gap_s"):
        SchedulingConfig.from_dict({"rescheduling": {"trigger_gap_s": -1}})
    assert SchedulingConfig.from_dict({"rescheduling": {"trigger_gap_s": None}}).rescheduling.trigger_gap_s is None
