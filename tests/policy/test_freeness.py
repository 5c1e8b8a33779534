"""Virtual usage and freeness (Algorithm 1) over literal snapshots."""
from __future__ import annotations

import dataclasses
import math

import pytest

from llumnix.policy import (
    FreenessConfig,
    average_normal_freeness,
    freeness,
    memory_load,
    normal_freeness,
    queue_aware_freeness,
    virtual_usages,
)
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait

HIGH_1600 = FreenessConfig()  # high = 1600 tokens = 100 blocks of 16, normal = 0
THREE_LEVELS = FreenessConfig(headroom_tokens={0: 0, 1: 160, 2: 320})  # 10 and 20 blocks


@pytest.mark.parametrize("status,cfg,expected", [
    # running: physical blocks only when there is no headroom
    (inst("a", running=[run("r1", 10), run("r2", 20)]), NO_HEADROOM, [10, 20]),
    # queued: the head of line counts its demand (40 tokens -> 3 blocks), the rest 0
    (inst("a", running=[run("r1", 10)], waiting=[wait("q1", 40), wait("q2", 400)]), NO_HEADROOM,
     [10, 3, 0]),
    # the engine-reported head-of-line demand is what counts
    (inst("a", waiting=[wait("q1", 40)], hol=7), NO_HEADROOM, [7]),
    # a snapshot that leaves the demand 0 falls back to the head's tokens
    (inst("a", waiting=[wait("q1", 40), wait("q2", 16)], hol=0), NO_HEADROOM, [3, 0]),
    # high-priority headroom (100 blocks) shared among the 2 high requests; normal gets none
    (inst("a", running=[run("h1", 4, prio=1), run("h2", 6, prio=1), run("n", 5)]), HIGH_1600,
     [54, 56, 5]),
    # a lone high request carries the whole headroom
    (inst("a", running=[run("h", 4, prio=1)]), HIGH_1600, [104]),
    # headroom is for running requests only: a queued high request is a plain HOL demand
    (inst("a", waiting=[wait("h", 32, prio=1)]), HIGH_1600, [2]),
    # more levels: each level's headroom shared among its own requests
    (inst("a", running=[run("a", 1, prio=1), run("b", 1, prio=2), run("c", 1, prio=2)]), THREE_LEVELS,
     [11, 11, 11]),
    # headroom tokens round up to whole blocks (17 tokens -> 2 blocks)
    (inst("a", running=[run("h", 1, prio=1)]), FreenessConfig(headroom_tokens={1: 17}), [3]),
    # terminating: a fake request of infinite usage
    (inst("a", running=[run("r1", 10)], term=True), NO_HEADROOM, [10, math.inf]),
    (inst("a", term=True), NO_HEADROOM, [math.inf]),
])
def test_virtual_usage(status, cfg, expected):
    assert virtual_usages(status, cfg) == expected


@pytest.mark.parametrize("status,cfg,expected", [
    (inst("idle", total=100), NO_HEADROOM, 100.0),                                  # B = 0 divides by 1
    (inst("one", running=[run("r", 10)]), NO_HEADROOM, 90.0),                       # B = 1
    (inst("a", running=[run("r1", 10), run("r2", 30)]), NO_HEADROOM, 30.0),         # (100 - 40) / 2
    (inst("a", running=[run("r1", 50)], waiting=[wait("q", 800)]), NO_HEADROOM, 0.0),   # HOL demand 50
    (inst("a", running=[run("r1", 60)], waiting=[wait("q", 1600)]), NO_HEADROOM, -60.0),  # overloaded
    (inst("q", waiting=[wait("q", 1600), wait("q2", 16)]), NO_HEADROOM, 0.0),       # queue only: B = 0 -> 1
    (inst("a", running=[run("r1", 10)], reserved=20), NO_HEADROOM, 70.0),           # incoming reservations
    (inst("h", running=[run("h", 10, prio=1), run("n", 10)]), HIGH_1600, -40.0),    # (100 - 120) x 2: a deficit
    (inst("h", running=[run("h", 10, prio=1), run("n", 10)]), NO_HEADROOM, 40.0),
    (inst("a", running=[run("r1", 10)], term=True), NO_HEADROOM, -math.inf),
])
def test_freeness(status, cfg, expected):
    assert freeness(status, cfg) == expected


def test_normal_freeness_keeps_headroom_but_not_the_fake_request():
    s = inst("a", running=[run("h", 10, prio=1), run("n", 10)], term=True)
    assert freeness(s, HIGH_1600) == -math.inf
    assert normal_freeness(s, HIGH_1600) == -10.0


@pytest.mark.parametrize("statuses,expected", [
    ([inst("a"), inst("b", running=[run("r", 80)])], (100 + 20) / 2),
    ([inst("a"), inst("b", term=True), inst("c", sched=False)], 100.0),  # only active instances count
    ([inst("b", term=True)], None),
    ([], None),
])
def test_mean_normal_freeness(statuses, expected):
    assert average_normal_freeness(statuses, NO_HEADROOM, "mean") == expected


@pytest.mark.parametrize("statuses,cfg,expected", [
    # free blocks of the whole cluster per running request: (100 + 20) / 1; the mean of
    # the two instances' freeness would be (100 + 20) / 2
    ([inst("a"), inst("b", running=[run("r", 80)])], NO_HEADROOM, 120.0),
    # (200 - 10 - 20 - 30 - 3 (head of line) - 5 (reserved)) / 3 running requests
    ([inst("a", running=[run("r1", 10), run("r2", 20)], waiting=[wait("q", 40)]),
      inst("b", running=[run("r3", 30)], reserved=5)], NO_HEADROOM, 132 / 3),
    # high-priority headroom stays reserved; a draining or unhealthy instance is left out
    ([inst("h", running=[run("h", 10, prio=1), run("n", 10)]), inst("t", term=True),
      inst("u", sched=False)], HIGH_1600, -10.0),
    ([inst("a"), inst("b")], NO_HEADROOM, 200.0),  # idle: all free blocks, divided by 1
    ([inst("t", term=True)], NO_HEADROOM, None),
])
def test_cluster_normal_freeness(statuses, cfg, expected):
    assert average_normal_freeness(statuses, cfg, "cluster") == expected
    assert average_normal_freeness(statuses, cfg) == expected  # the default


@pytest.mark.parametrize("statuses,cfg,expected", [
    # every queued request counts its demand and a batch slot:
    # (200 - 10 - 20 - 30 - 3 - 4 (the two queued) - 5 (reserved)) / (3 running + 2 queued)
    ([inst("a", running=[run("r1", 10), run("r2", 20)], waiting=[wait("q1", 40), wait("q2", 50)]),
      inst("b", running=[run("r3", 30)], reserved=5)], NO_HEADROOM, 128 / 5),
    # no queue: the same as the cluster signal
    ([inst("a"), inst("b", running=[run("r", 80)])], NO_HEADROOM, 120.0),
    # headroom stays reserved; a queued request on a draining instance is left out with it
    ([inst("h", running=[run("h", 10, prio=1)], waiting=[wait("q", 16)]),
      inst("t", running=[run("x", 10)], waiting=[wait("y", 160)], term=True)], HIGH_1600, (100 - 110 - 1) / 2),
    ([inst("t", term=True)], NO_HEADROOM, None),
])
def test_demand_normal_freeness(statuses, cfg, expected):
    assert average_normal_freeness(statuses, cfg, "demand") == pytest.approx(expected)


def test_a_queue_lowers_the_demand_signal_not_the_cluster_signal_beyond_its_head():
    """Ten requests of 8 blocks queued behind a head of 8: the cluster signal counts the
    head's 8 blocks; the demand signal all 80, and ten more requests to share the rest."""
    base = inst("a", running=[run("r", 20)])
    queued = dataclasses.replace(base, waiting=tuple(wait(f"q{k}", 128) for k in range(10)))
    assert average_normal_freeness([base], NO_HEADROOM, "demand") == 80.0
    assert average_normal_freeness([queued], NO_HEADROOM, "cluster") == 100 - 20 - 8
    assert average_normal_freeness([queued], NO_HEADROOM, "demand") == pytest.approx((100 - 20 - 80) / 11)


def test_cluster_signal_does_not_jump_when_one_instance_empties():
    """Five instances each running 4 requests of 20 blocks; then one empties (its requests
    finished). The mean of ratios jumps by about M/n; the cluster's freeness moves
    by what was freed."""
    busy = [inst(f"i{k}", running=[run(f"r{k}{j}", 20) for j in range(4)]) for k in range(5)]
    one_idle = busy[:4] + [inst("i4")]
    mean_before = average_normal_freeness(busy, NO_HEADROOM, "mean")
    mean_after = average_normal_freeness(one_idle, NO_HEADROOM, "mean")
    assert (mean_before, mean_after) == (5.0, (4 * 5.0 + 100) / 5)  # 5 -> 24
    assert average_normal_freeness(busy, NO_HEADROOM, "cluster") == 100 / 20
    assert average_normal_freeness(one_idle, NO_HEADROOM, "cluster") == 180 / 16


@pytest.mark.parametrize("status,expected", [
    (inst("a"), 0.0),
    (inst("a", running=[run("r", 30)]), 0.3),
    # every queued request's demand counts, not only the head of line
    (inst("a", running=[run("r", 30)], waiting=[wait("q1", 160), wait("q2", 161)]), (30 + 10 + 11) / 100),
])
def test_memory_load(status, expected):
    assert memory_load(status) == pytest.approx(expected)


@pytest.mark.parametrize("status,cfg,expected", [
    (inst("idle"), NO_HEADROOM, 100.0),
    # every queued request counts its demand and a batch slot: (100 - 30 - 10 - 20) / 3
    (inst("a", running=[run("r", 30)], waiting=[wait("q1", 160), wait("q2", 320)]), NO_HEADROOM, 40 / 3),
    (inst("h", running=[run("h", 10, prio=1)], waiting=[wait("q", 16)]), HIGH_1600, (100 - 110 - 1) * 2),
    (inst("a", running=[run("r", 30)], reserved=10), NO_HEADROOM, 60.0),
    (inst("a", running=[run("r", 30)], term=True), NO_HEADROOM, -math.inf),
])
def test_queue_aware_freeness(status, cfg, expected):
    assert queue_aware_freeness(status, cfg) == pytest.approx(expected)


def test_the_total_is_the_sum_of_every_virtual_usage_exactly():
    # total_virtual_usage takes a shortcut when no running priority carries headroom;
    # on random snapshots, with and without headroom, it equals the per-request sum.
    import random

    from llumnix.core.status import InstanceStatus, RequestBrief
    from llumnix.policy.config import FreenessConfig
    from llumnix.policy.freeness import total_virtual_usage, virtual_usages

    rng = random.Random(3)
    for cfg in (FreenessConfig(), FreenessConfig(headroom_tokens={0: 0, 1: 1600}),
                FreenessConfig(headroom_tokens={0: 48, 1: 1600})):
        for k in range(300):
            running = tuple(RequestBrief(f"r{i}", rng.choice((0, 0, 0, 1)), rng.randint(1, 90), 16, 0.0, True)
                            for i in range(rng.randint(0, 12)))
            waiting = tuple(RequestBrief(f"w{i}", 0, 0, rng.randint(1, 900), 0.0, False)
                            for i in range(rng.randint(0, 3)))
            st = InstanceStatus(f"i{k}", 0.0, 2000, 0, 10, 16, 64, running=running, waiting=waiting,
                                num_reserved_blocks=rng.randint(0, 5), is_terminating=rng.random() < 0.1)
            for fake in (True, False):
                want = sum(virtual_usages(st, cfg, fake=fake)) + st.num_reserved_blocks
                assert total_virtual_usage(st, cfg, fake=fake) == want


def test_blocks_shared_by_running_requests_count_once():
    """Two requests of 10 blocks that share 6 (prefix caching) hold 14 blocks, not 20."""
    import dataclasses

    from llumnix.policy.freeness import freeness, queue_aware_freeness

    s = inst("a", total=100, running=[run("x", 10), run("y", 10)])
    shared = dataclasses.replace(s, num_used_blocks=14, num_shared_block_holds=6)
    assert freeness(s, NO_HEADROOM) == (100 - 20) / 2
    assert freeness(shared, NO_HEADROOM) == (100 - 14) / 2
    assert queue_aware_freeness(shared, NO_HEADROOM) == (100 - 14) / 2


# A burst's prompts counted before any runs can overdraw an instance (sum V > M). Dividing
# the deficit by B ranked the more crowded one freer: -10 / 10 = -1 > -6 / 4 = -1.5.
OVERDRAWN_CROWDED = inst("crowded", total=40, running=[run(f"c{k}", 5) for k in range(10)])  # 50 of 40
OVERDRAWN_FEW = inst("few", total=40, running=[run(f"f{k}", 11) for k in range(4)] + [run("f4", 2)])  # 46


@pytest.mark.parametrize("score", [freeness, queue_aware_freeness])
def test_an_overdrawn_instance_with_more_requests_is_less_free(score):
    crowded, few = score(OVERDRAWN_CROWDED, NO_HEADROOM), score(OVERDRAWN_FEW, NO_HEADROOM)
    assert crowded == -10 * 10 and few == -6 * 5
    assert crowded < few


def test_freeness_falls_as_requests_join_on_both_sides_of_zero():
    values = [freeness(inst("a", total=40, running=[run(f"r{k}", 6) for k in range(n)]), NO_HEADROOM)
              for n in range(1, 12)]
    assert values == sorted(values, reverse=True) and values[-1] < 0 < values[0]
