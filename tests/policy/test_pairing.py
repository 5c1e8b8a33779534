"""Migration pairing: thresholds, lowest with highest, terminating sources, in-flight caps."""
from __future__ import annotations

import pytest

from llumnix.policy import ReschedulingConfig, pair_migrations
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait

BUSY = [run(f"b{k}", 19) for k in range(5)]        # F = (100 - 95) / 5 = 1
FULL = [run(f"f{k}", 24) for k in range(4)]        # F = (100 - 96) / 4 = 1
TIGHT = [run(f"t{k}", 49) for k in range(2)]       # F = (100 - 98) / 2 = 1
EDGE = [run(f"e{k}", 22) for k in range(4)]        # F = (100 - 88) / 4 = 3: neither side at 3/3
MID = [run("m", 50)]                               # F = 50


def pairs(statuses, **cfg):
    return [(o.src_instance_id, o.dst_instance_id)
            for o in pair_migrations(statuses, ReschedulingConfig(**cfg), NO_HEADROOM)]


@pytest.mark.parametrize("statuses,cfg,expected", [
    # lowest with highest, then next lowest with next highest; ties by id
    ([inst("busy", running=BUSY), inst("full", running=FULL), inst("mid", running=MID), inst("empty")],
     {}, [("busy", "empty"), ("full", "mid")]),
    # the lowest freeness is paired first
    ([inst("a", running=[run("x", 97)]), inst("b", running=TIGHT), inst("empty")], {}, [("b", "empty")]),
    # more sources than destinations: the extra sources wait for the next round
    ([inst("s1", running=BUSY), inst("s2", running=FULL), inst("d")], {}, [("s1", "d")]),
    # nobody below the out threshold: no orders
    ([inst("mid", running=MID), inst("empty")], {}, []),
    # exactly at the threshold is neither a source nor a destination
    ([inst("edge", running=EDGE), inst("empty")], {}, []),
    ([inst("busy", running=BUSY), inst("edge", running=EDGE)], {}, []),
    # a higher in threshold: F = 50 is no destination above 60, and F = 1 still a source
    ([inst("busy", running=BUSY), inst("mid", running=MID)], {"in_threshold": 60}, []),
    ([inst("busy", running=BUSY), inst("mid", running=MID)], {"in_threshold": 40}, [("busy", "mid")]),
    # a raised out threshold makes mid a source too (the paper's 10 for M-M)
    ([inst("mid", running=MID), inst("empty")], {"out_threshold": 60, "in_threshold": 60}, [("mid", "empty")]),
])
def test_pairing_thresholds_and_order(statuses, cfg, expected):
    assert pairs(statuses, **cfg) == expected


@pytest.mark.parametrize("statuses,cfg,expected", [
    # at max_in the emptiest instance is skipped; the next one takes the source
    ([inst("busy", running=BUSY), inst("capped", mig_in=1), inst("mid", running=MID)], {}, [("busy", "mid")]),
    # at max_out the source sits this round out
    ([inst("busy", running=BUSY, mig_out=1), inst("full", running=FULL), inst("empty")], {},
     [("full", "empty")]),
    # raising the caps lets instances with migrations in flight take part again
    ([inst("busy", running=BUSY, mig_out=1), inst("capped", mig_in=1)], {"max_out": 2, "max_in": 2},
     [("busy", "capped")]),
    # a source whose every request is already migrating has nothing to give
    ([inst("busy", running=[run(f"b{k}", 19, migrating=True) for k in range(5)]), inst("empty")], {}, []),
])
def test_pairing_respects_in_flight_caps(statuses, cfg, expected):
    assert pairs(statuses, **cfg) == expected


@pytest.mark.parametrize("statuses,expected", [
    # terminating: always a source (F = -inf, paired first), even when nearly empty
    ([inst("going", running=[run("r", 5)], term=True), inst("busy", running=BUSY), inst("stay"),
      inst("mid", running=MID)], [("going", "stay"), ("busy", "mid")]),
    # never a destination, however empty it looks
    ([inst("busy", running=BUSY), inst("going", term=True)], []),
    # an empty terminating instance has nothing to move
    ([inst("going", term=True), inst("stay")], []),
    # unhealthy (unschedulable) instances take no part
    ([inst("busy", running=BUSY, sched=False), inst("empty")], []),
    ([inst("busy", running=BUSY), inst("empty", sched=False)], []),
    # a terminating instance drains even when marked unschedulable
    ([inst("going", running=[run("r", 5)], term=True, sched=False), inst("stay")], [("going", "stay")]),
])
def test_terminating_and_unschedulable_instances(statuses, expected):
    assert pairs(statuses) == expected


WIDE = [run("w", 92)]                              # F = 8: freest, but only 8 blocks free
ROOMY = [run(f"r{k}", 5) for k in range(10)]       # F = 5: 50 blocks free


@pytest.mark.parametrize("statuses,expected_paper,expected_fit", [
    # the source gives up a 19-block request: the freest destination cannot reserve it,
    # the less free one with 50 free blocks can; the paper's order (busy -> wide) would be
    # refused there, and is left out
    ([inst("busy", running=BUSY), inst("wide", running=WIDE), inst("roomy", running=ROOMY)],
     [], [("busy", "roomy")]),
    # no destination has room: the paper's order would be refused there, so neither rule
    # makes it (issue 32: such orders were a fifth of the migrations started on an H200)
    ([inst("busy", running=BUSY), inst("wide", running=WIDE)], [], []),
    # a queued request (the shortest here) moves as metadata: any destination will do
    ([inst("busy", running=BUSY, waiting=[wait("q", 16)]), inst("wide", running=WIDE),
      inst("roomy", running=ROOMY)], [("busy", "wide")], [("busy", "wide")]),
    # the lowest source takes the roomy destination; the next one (F = 28 / 12) gives up
    # a 6-block request, which fits the wide one (8 free, less 1 watermark and 1 block of
    # growth); the paper's order busy -> wide would be refused, and is left out
    ([inst("busy", running=BUSY), inst("small", running=[run(f"s{k}", 6) for k in range(12)]),
      inst("wide", running=WIDE), inst("roomy", running=ROOMY)],
     [("small", "roomy")], [("busy", "roomy"), ("small", "wide")]),
])
def test_fit_pairing_pairs_sources_with_destinations_that_can_reserve(statuses, expected_paper, expected_fit):
    assert pairs(statuses) == expected_paper
    assert pairs(statuses, pairing="fit") == expected_fit


@pytest.mark.parametrize("statuses,expected_fit,expected_stable", [
    # busy gives up a 19-block request; the freest destination, roomy (F = 50), keeps
    # (100 - 50 - 19) / 2 = 15.5 >= 3 after taking it: both rules pick it
    ([inst("busy", running=BUSY), inst("near", running=[run(f"n{k}", 20) for k in range(4)]),
      inst("roomy", running=MID)],
     [("busy", "roomy")], [("busy", "roomy")]),
    # only near is a destination (F = (100 - 76) / 4 = 6 > 3) and has room (24 free, less 1
    # watermark and 1 block of growth); after 19 more blocks and a fifth request it would
    # be at (24 - 19) / 5 = 1 < 3: stable leaves busy unpaired
    ([inst("busy", running=BUSY), inst("near", running=[run(f"n{k}", 19) for k in range(4)])],
     [("busy", "near")], []),
    # a queued request counts its prompt's demand there: 2 blocks keep near at 18 / 5 = 3.6
    ([inst("busy", running=BUSY, waiting=[wait("q", 32)]),
      inst("near", running=[run(f"n{k}", 20) for k in range(4)])],
     [("busy", "near")], [("busy", "near")]),
    # ... and a 6-block prompt would not: (20 - 6) / 5 = 2.8
    ([inst("busy", running=BUSY, waiting=[wait("q", 96)]),
      inst("near", running=[run(f"n{k}", 20) for k in range(4)])],
     [("busy", "near")], []),
])
def test_stable_pairing_never_makes_the_destination_a_source(statuses, expected_fit, expected_stable):
    assert pairs(statuses, pairing="fit") == expected_fit
    assert pairs(statuses, pairing="stable") == expected_stable


@pytest.mark.parametrize("statuses,expected_paper,expected_even", [
    # busy (F = 1) gives up a 19-block request; near would be at (24 - 19) / 5 = 1 after it,
    # no freer than busy was: the next pass would move it back (issue 45's re-moves)
    ([inst("busy", running=BUSY), inst("near", running=[run(f"n{k}", 19) for k in range(4)])],
     [("busy", "near")], []),
    # roomy stays at (100 - 50 - 19) / 2 = 15.5 > 1: both pair it
    ([inst("busy", running=BUSY), inst("near", running=[run(f"n{k}", 19) for k in range(4)]),
      inst("roomy", running=MID)],
     [("busy", "roomy")], [("busy", "roomy")]),
    # a draining instance (F = -inf) moves anything a destination has room for
    ([inst("busy", running=BUSY, term=True), inst("near", running=[run(f"n{k}", 19) for k in range(4)])],
     [("busy", "near")], [("busy", "near")]),
    # a blocked queue, F = (100 - 96 - 2) / 4 = 0.5, gives up its 2-block prompt: near goes
    # to (16 - 2) / 5 = 2.8, a source (stable refuses) but freer than 0.5 (even pairs)
    ([inst("jam", running=FULL, waiting=[wait("q", 32)]), inst("near", running=[run(f"n{k}", 21) for k in range(4)])],
     [("jam", "near")], [("jam", "near")]),
])
def test_even_pairing_never_leaves_the_destination_less_free_than_the_source(statuses, expected_paper, expected_even):
    assert pairs(statuses) == expected_paper
    assert pairs(statuses, pairing="even") == expected_even


def test_even_pairs_where_stable_would_not():
    jam = [inst("jam", running=FULL, waiting=[wait("q", 32)]), inst("near", running=[run(f"n{k}", 21) for k in range(4)])]
    assert pairs(jam, pairing="stable") == []
    assert pairs(jam, pairing="even") == [("jam", "near")]


def test_dst_queue_all_keeps_moves_off_a_destination_whose_queue_owns_its_free_blocks():
    # issue 32's bench: a burst of dispatches has just queued three 2-block prompts on "q"
    # (1 running on 1 block, 9 of 10 free). Algorithm 1 counts only the head of line:
    # F = (10 - 1 - 2) / 1 = 7, the freest destination, and the move takes the blocks its
    # queue is about to get. Counting every queued request: (10 - 1 - 6) / 4 = 0.75
    src = inst("src", total=10, running=[run(f"s{k}", 2) for k in range(5)])   # F = 0
    q = inst("q", total=10, running=[run("r", 1)], waiting=[wait(f"w{k}", 32) for k in range(3)])
    assert pairs([src, q]) == [("src", "q")]
    assert pairs([src, q], dst_queue="all") == []
    # an instance with no queue is judged the same by both rules
    idle = inst("idle", total=10, running=[run("r", 1)])                          # F = 9
    assert pairs([src, idle]) == pairs([src, idle], dst_queue="all") == [("src", "idle")]


def test_dst_queue_all_leaves_room_for_the_queue_and_ends_a_chain_onto_a_queued_instance():
    from llumnix.policy.config import FreenessConfig
    from llumnix.policy.freeness import room_for_migration
    from llumnix.policy.rounds import keep_migrating

    # 20 free blocks (1 of them the watermark), one 2-block prompt queued
    dst = inst("d", total=24, running=[run("r", 4)], waiting=[wait("w", 32)])
    assert room_for_migration(dst) == 20 - 1 - 1
    assert room_for_migration(dst, queued=True) == 20 - 1 - 1 - 2
    src = inst("s", total=10, running=[run(f"s{k}", 2) for k in range(5)])
    fcfg = FreenessConfig(headroom_tokens={})
    assert keep_migrating(src, dst, 0, ReschedulingConfig(), fcfg)
    crowded = inst("d", total=24, running=[run("r", 4)], waiting=[wait(f"w{k}", 96) for k in range(3)])
    assert keep_migrating(src, crowded, 0, ReschedulingConfig(), fcfg)             # Alg. 1: F = 14
    assert not keep_migrating(src, crowded, 0, ReschedulingConfig(dst_queue="all"), fcfg)  # (20-18)/4


def test_dst_queue_is_checked():
    from llumnix.policy.config import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="unknown dst_queue 'some'"):
        ReschedulingConfig(dst_queue="some")
