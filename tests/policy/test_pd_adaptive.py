"""policy/pd.py, adaptive PD under bursts: several lends a round, reclaim hysteresis,
queued prompts spread over the prefill-taking instances."""
from __future__ import annotations

import dataclasses
import random

import pytest

from llumnix.policy import SchedulingConfig
from llumnix.policy.config import PolicyConfigError
from llumnix.policy.pd import (
    PDConfig,
    PoolView,
    RoleChange,
    adaptive_decisions,
    queue_moves,
)

BURSTY = PDConfig(mode="adaptive", prefill_instances=2, lend_above_tokens=4000, reclaim_below_tokens=1000,
                  decode_room_freeness=10, decode_tight_freeness=2, cooldown_s=0.1, max_lends_per_round=8,
                  reclaim_after_s=1.0)
ROLES = {"p1": "prefill", "p2": "prefill", **{f"d{k}": "decode" for k in range(1, 7)}}
FREE = {"d1": 20, "d2": 60, "d3": 40, "d4": 50, "d5": 30, "d6": 15}


@pytest.mark.parametrize(("doc", "path"), [
    ({"max_lends_per_round": 0}, "pd.max_lends_per_round"),
    ({"reclaim_after_s": -1}, "pd.reclaim_after_s"),
    ({"rebalance_queued": "yes"}, "pd.rebalance_queued"),
])
def test_bad_adaptive_values_are_one_line_errors_naming_the_path(doc, path):
    with pytest.raises(PolicyConfigError) as e:
        SchedulingConfig.from_dict({"pd": doc})
    assert str(e.value).count("\n") == 0 and path in str(e.value)


def test_a_burst_lends_as_many_decode_instances_as_its_queue_needs_in_one_round():
    # 20,000 queued tokens need 5 takers at 4,000 each: 3 lends, the freest decode ones
    v = PoolView(ROLES, {}, {"p1": 12000, "p2": 8000}, FREE)
    assert adaptive_decisions(v, BURSTY, 10.0, None) == [
        RoleChange("d2", "mixed", "lend"), RoleChange("d4", "mixed", "lend"), RoleChange("d3", "mixed", "lend")]
    # at most max_lends_per_round; the pool keeps min_decode
    capped = dataclasses.replace(BURSTY, max_lends_per_round=2)
    assert len(adaptive_decisions(v, capped, 10.0, None)) == 2
    huge = PoolView(ROLES, {}, {"p1": 90000, "p2": 90000}, FREE)
    assert len(adaptive_decisions(huge, BURSTY, 10.0, None)) == 5  # 6 decode instances, min_decode 1
    # just above the threshold: one lend (the default's behaviour)
    barely = PoolView(ROLES, {}, {"p1": 4100, "p2": 4000}, FREE)
    assert adaptive_decisions(barely, BURSTY, 10.0, None) == [RoleChange("d2", "mixed", "lend")]
    # the cooldown holds every change back; no room in the decode pool, no lend
    assert adaptive_decisions(v, BURSTY, 10.0, 9.95) == []
    tight = PoolView(ROLES, {}, {"p1": 12000, "p2": 8000}, dict.fromkeys(FREE, 3.0))
    assert adaptive_decisions(tight, BURSTY, 10.0, None) == []


def test_a_lent_instance_is_reclaimed_only_after_reclaim_after_s():
    roles = {**ROLES, "d2": "mixed", "d4": "mixed"}
    low = {"p1": 200, "p2": 0, "d2": 0, "d4": 0}
    v = PoolView(roles, {"d2": 9.5, "d4": 8.0}, low, FREE)
    # d2 was lent 0.5 s ago and stays; d4, lent 2 s, goes back
    assert adaptive_decisions(v, BURSTY, 10.0, None) == [RoleChange("d4", "decode", "reclaim")]
    # not while a prompt of its own is still queued there (a hand-off would wait behind it)
    busy = PoolView(roles, {"d2": 9.5, "d4": 8.0}, {**low, "d4": 500}, FREE)
    assert adaptive_decisions(busy, BURSTY, 10.0, None) == []
    held = PoolView(roles, {"d2": 9.5, "d4": 9.5}, low, dict.fromkeys(FREE, 1.0), num_waiting_handoffs=2)
    # both still held: nothing is reclaimed, and no prefill instance flips to decode meanwhile
    assert adaptive_decisions(held, BURSTY, 10.0, None) == []
    assert adaptive_decisions(held, BURSTY, 10.6, None) == [RoleChange("d2", "decode", "reclaim")]


def test_queue_moves_take_the_last_queued_prompt_of_the_most_loaded_to_the_least():
    loads = {"p1": 9000, "p2": 3000, "m": 0}
    queued = {"p1": [("a", 2000), ("b", 3000)], "p2": [], "m": []}  # p1 prefills 4,000 more now
    assert queue_moves(loads, queued, 8) == [("b", "p1", "m"), ("a", "p1", "m")]
    assert queue_moves(loads, queued, 1) == [("b", "p1", "m")]
    # a move that would leave the destination at least as loaded as the source is not made
    assert queue_moves({"p1": 3000, "m": 0}, {"p1": [("a", 3000)], "m": []}, 8) == []
    # nothing movable on the most loaded (its prompt is in progress): the next one's moves
    assert queue_moves({"p1": 9000, "p2": 5000, "m": 0}, {"p1": [], "p2": [("c", 2500)], "m": []}, 8) == [
        ("c", "p2", "m")]


def test_queue_moves_end_and_never_undo_a_move():
    rng = random.Random(7)
    for _ in range(200):
        ids = [f"i{k}" for k in range(rng.randint(1, 6))]
        queued = {i: [(f"{i}-{k}", rng.randint(1, 4000)) for k in range(rng.randint(0, 5))] for i in ids}
        loads = {i: sum(t for _, t in queued[i]) + rng.choice([0, 3000]) for i in ids}
        moves = queue_moves(loads, queued, 100)
        assert len({rid for rid, _, _ in moves}) == len(moves)  # each prompt moves once at most
        tokens = {rid: t for q in queued.values() for rid, t in q}
        after = dict(loads)
        for rid, src, dst in moves:
            before = after[src] ** 2 + after[dst] ** 2
            after[src] -= tokens[rid]
            after[dst] += tokens[rid]
            assert after[src] ** 2 + after[dst] ** 2 < before
        assert sum(after.values()) == sum(loads.values())
        # it stopped because the next move would not help: the last prompt left on the most
        # loaded instance with one would not fit below it on the least loaded
        left = {i: [rid for rid, _ in queued[i] if rid not in {m[0] for m in moves}] for i in ids}
        srcs = [i for i in ids if left[i]]
        if srcs:
            src = max(srcs, key=lambda i: (after[i], i))
            assert min(after.values()) + tokens[left[src][-1]] >= after[src]
