"""Which requests a source gives up: paper rule, SR, LR, FCW; priorities; migrating ones skipped."""
from __future__ import annotations

import pytest

from llumnix.policy import PolicyConfigError, select_requests
from tests.policy.snapshots import inst, run, wait

SRC = inst("s", running=[run("long", 30, 480, t=0.5), run("short", 2, 20, t=0.4), run("hi", 1, 10, prio=1),
                         run("moving", 1, 5, migrating=True)],
           waiting=[wait("q-late", 50, t=2.0), wait("q-early", 300, t=1.0), wait("q-hi", 5, prio=1)])


@pytest.mark.parametrize("policy,expected", [
    ("paper", ["short", "q-late", "q-early", "long"]),   # normal only, shorter first, running and queued
    ("SR", ["short", "long"]),
    ("LR", ["long", "short"]),
    ("FCW", ["q-early", "q-late"]),
])
def test_selection_order(policy, expected):
    assert select_requests(SRC, policy, max_n=10) == expected
    assert select_requests(SRC, policy) == expected[:1]  # max_n = 1 by default


@pytest.mark.parametrize("status,policy,exclude,expected", [
    # high priority only once no normal request is left to move
    (inst("s", running=[run("hi", 1, prio=1)]), "paper", (), ["hi"]),
    (SRC, "paper", {"short", "q-late", "q-early", "long"}, ["q-hi", "hi"]),
    # SR/LR look at running requests only; a normal queued one still shields the high ones
    (inst("s", running=[run("hi", 1, prio=1)], waiting=[wait("q", 16)]), "SR", (), []),
    (inst("s", running=[run("hi", 1, prio=1)], waiting=[wait("q", 16)]), "paper", (), ["q"]),
    (inst("s", running=[run("n", 9)], waiting=[wait("q-hi", 16, prio=1)]), "FCW", (), []),
    # three levels: the lowest present goes first
    (inst("s", running=[run("p2", 1, prio=2), run("p1", 5, prio=1)]), "paper", (), ["p1"]),
    # already migrating (flagged in the snapshot or tracked by the llumlet) is never chosen
    (inst("s", running=[run("m", 1, migrating=True), run("r", 50)]), "SR", (), ["r"]),
    (inst("s", waiting=[wait("m", 1, migrating=True), wait("q", 900)]), "FCW", (), ["q"]),
    (inst("s", running=[run("a", 1), run("b", 2)]), "SR", {"a"}, ["b"]),
    (inst("s", running=[run("a", 1, migrating=True)]), "paper", (), []),
    # ties on length: earlier arrival, then id
    (inst("s", running=[run("b", 2, t=1.0), run("a", 2, t=1.0), run("c", 2, t=0.0)]), "paper", (),
     ["c", "a", "b"]),
    (inst("s"), "paper", (), []),
])
def test_selection_rules(status, policy, exclude, expected):
    assert select_requests(status, policy, max_n=10, exclude=exclude) == expected


def test_unknown_selection_policy():
    with pytest.raises(PolicyConfigError, match="unknown selection policy 'XL'"):
        select_requests(SRC, "XL")


@pytest.mark.parametrize("dst_room,expected", [
    (None, ["short", "q-late", "q-early", "long"]),   # any queued request may move
    (100, ["short", "q-late", "q-early", "long"]),    # q-early needs 19 blocks: fits
    (18, ["short", "q-late", "long"]),                # q-early would queue again there
    (4, ["short", "q-late", "long"]),                 # q-late needs exactly 4
    (3, ["short", "long"]),
    (0, ["short", "long"]),                           # no room: running requests only
])
def test_queued_request_moves_only_where_it_starts(dst_room, expected):
    assert select_requests(SRC, "paper", max_n=10, dst_room=dst_room) == expected


def test_room_rule_also_holds_for_the_blocked_head_of_line():
    s = inst("s", total=20, running=[run("r", 15)], waiting=[wait("hol", 160), wait("q", 16)])
    assert select_requests(s, max_n=3, hol_first=True) == ["hol", "q", "r"]
    assert select_requests(s, max_n=3, hol_first=True, dst_room=5) == ["q", "r"]


def test_freed_prefers_what_frees_the_source_per_block_moved():
    """Selection ``freed``: a request on a prefix that 64 of its 70 blocks share with others
    frees 6 blocks for 70 moved; a longer one on a prefix of its own frees all it moves."""
    s = inst("s", running=[run("popular", 70), run("own", 120), run("half", 40), run("hi", 2, prio=1)],
             waiting=[wait("q", 200)])
    shared = {"popular": 64, "own": 0, "half": 20, "hi": 0}
    assert select_requests(s, "freed", max_n=10, shared=shared) == ["q", "own", "half", "popular"]
    assert select_requests(s, "paper", max_n=10) == ["q", "half", "popular", "own"]
    # without sharing it is the paper's order; a request that frees nothing goes last
    assert select_requests(s, "freed", max_n=10, shared={}) == select_requests(s, "paper", max_n=10)
    assert select_requests(s, "freed", max_n=10, shared={**shared, "own": 120})[-1] == "own"


@pytest.mark.parametrize("dst_free,expected", [
    (None, ["a", "b", "c"]),   # no destination given: shortest first
    (10, ["a", "b", "q"]),     # c (12 blocks) cannot be reserved there; q moves as metadata
    (4, ["a", "q"]),           # only a (4 blocks) and the queued request
    (0, ["q"]),
])
def test_dst_free_leaves_out_running_requests_the_destination_cannot_reserve(dst_free, expected):
    s = inst("s", running=[run("a", 4, 50), run("b", 8, 120), run("c", 12, 180)], waiting=[wait("q", 400)])
    assert select_requests(s, "paper", 3, dst_free=dst_free) == expected
