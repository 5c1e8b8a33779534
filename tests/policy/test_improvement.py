"""Our improvements over the paper's Llumnix (issue 5), both opt-in: the decode shield
(dispatch ``shield: true``) and head-of-line de-fragmentation (``defrag: hol``)."""
from __future__ import annotations

import pytest

from llumnix.core.status import RequestBrief
from llumnix.policy import (
    DispatchRequest,
    GlobalScheduler,
    PolicyConfigError,
    ReschedulingConfig,
    SchedulingConfig,
    make_pipeline,
    pair_migrations,
    select_requests,
)
from llumnix.policy.decode_shield import is_loaded, shield_pick, stall_harm
from llumnix.policy.defrag import is_blocked, plan_hol_moves, room_after
from llumnix.policy.freeness import fits_now
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait


def dec(rid: str, blocks: int, out: int) -> RequestBrief:
    """A running request that has produced ``out`` tokens."""
    return RequestBrief(rid, 0, blocks, blocks * 16, 0.0, True, False, out)


# -- decode shield -------------------------------------------------------------------
def test_stall_harm_counts_young_requests_by_one_over_their_output():
    s = inst("a", running=[dec("x", 2, 1), dec("y", 2, 4), dec("z", 2, 0), dec("old", 2, 64)])
    assert stall_harm(s) == pytest.approx(1.0 + 0.25 + 1.0)  # k=0 counts as 1; k>=64 not at all
    assert stall_harm(inst("idle")) == 0.0


def test_fits_now_counts_the_queue_and_the_watermark():
    s = inst("a", running=[run("r", 80)], waiting=[wait("q", 100)])  # 20 free, queue needs 7
    assert fits_now(s, 12 * 16)          # 7 + 12 = 19 <= 20 - 1
    assert not fits_now(s, 13 * 16)      # 20 > 19


def test_is_loaded_below_a_fifth_of_the_blocks_free():
    assert is_loaded([inst("a", running=[run("r", 90)]), inst("b", running=[run("s", 85)])])  # 25/200
    assert not is_loaded([inst("a", running=[run("r", 90)]), inst("b", running=[run("s", 60)])])  # 50/200


YOUNG = inst("young", running=[dec("y1", 10, 1), dec("y2", 10, 2)])   # 80 free, harm 1.5
OLD = inst("old", running=[dec("o1", 20, 300), dec("o2", 20, 400)])   # 60 free, harm 0
FULL = inst("full", running=[dec("f", 60, 500)])                      # 40 free, harm 0


@pytest.mark.parametrize("cands,scores,prompt,expected", [
    # a long prompt leaves the freest instance for one within the slack without young requests
    ([OLD, YOUNG], [0.6, 1.0], 512, "old"),
    # a short prompt (or an unknown one) goes by score alone, as max-score does
    ([OLD, YOUNG], [0.6, 1.0], 511, "young"),
    ([OLD, YOUNG], [0.6, 1.0], None, "young"),
    # out of the slack: the score wins even for a long prompt
    ([OLD, YOUNG], [0.4, 1.0], 512, "young"),
    # the prompt must fit now: 40 blocks do not fit in full's 40 - 1 (watermark)
    ([FULL, YOUNG], [0.9, 1.0], 640, "young"),
    # equal harm: the higher score, then the lower id
    ([FULL, OLD, YOUNG], [0.8, 0.9, 1.0], 512, "old"),
    ([FULL, OLD, YOUNG], [0.9, 0.9, 1.0], 512, "full"),
])
def test_shield_pick(cands, scores, prompt, expected):
    assert shield_pick(cands, scores, prompt).instance_id == expected


def test_shield_steps_aside_on_a_loaded_cluster():
    young = inst("a", total=1000, running=[dec("y", 800, 1)])   # 200 free
    old = inst("b", total=1000, running=[dec("o", 850, 300)])   # 150 free: 350 / 2000 < 20%
    assert shield_pick([young, old], [1.0, 0.9], 512).instance_id == "a"
    roomier = inst("b", total=1000, running=[dec("o", 700, 300)])  # 500 / 2000: shield on
    assert shield_pick([young, roomier], [1.0, 0.9], 512).instance_id == "b"


def test_shield_steps_aside_while_any_candidate_has_a_queue():
    young = inst("a", total=1000, running=[dec("y", 100, 1)])
    old = inst("b", total=1000, running=[dec("o", 100, 300)])
    assert shield_pick([young, old], [1.0, 0.9], 512).instance_id == "b"
    queued = inst("c", total=1000, running=[dec("q", 900, 300)], waiting=[wait("w", 16)])
    assert is_loaded([young, old, queued])
    assert shield_pick([young, old, queued], [1.0, 0.9, 0.0], 512).instance_id == "a"


def test_llumnix_dispatch_with_the_shield_routes_long_prompts_only():
    cfg = SchedulingConfig.from_dict({"freeness": {"headroom_tokens": {}},
                                      "dispatch": {"policy": "llumnix", "params": {"queued": "all", "shield": True},
                                                   "pending_grace_s": 0.0}})
    gs = GlobalScheduler(cfg)
    assert gs._index is None  # the picker reads the request: the full pipeline decides
    # freeness (all queued): young 80 / 2 = 40, old 60 / 2 = 30 -> scores 1.0, 0.0 with two
    # candidates; a third, emptier instance widens the range so old is within the slack.
    for s in (YOUNG, OLD, inst("tiny", running=[dec("t", 95, 1000)])):  # tiny: 5 / 1 = 5
        gs.add_instance(s)
    # scores: young 1.0, old (30 - 5) / 35 = 0.71, tiny 0. max-score would pick young.
    assert gs.dispatch(DispatchRequest("long", 600), 0.0) == "old"
    assert gs.dispatch(DispatchRequest("short", 100), 0.0) == "young"


def test_the_shield_is_opt_in_and_validated():
    assert make_pipeline("llumnix", {"queued": "all"}).picker == "max-score"
    assert make_pipeline("llumnix", {"shield": False}).picker == "max-score"
    assert make_pipeline("llumnix", {"shield": True}).picker == "decode-shield"
    with pytest.raises(PolicyConfigError, match="shield"):
        make_pipeline("llumnix", {"shield": "yes"})


# -- head-of-line de-fragmentation ------------------------------------------------------
BLOCKED = inst("blocked", running=[run("b1", 60), run("b2", 30)], waiting=[wait("hol", 600, t=1.0)])
# 10 free, HOL needs 38 -> blocked; freeness (100 - 90 - 38) / 2 = -14
ROOMY = inst("roomy", running=[run("r1", 10)])                  # 90 free
SNUG = inst("snug", running=[run("s1", 40), run("s2", 30)])     # 30 free


def test_is_blocked():
    assert is_blocked(BLOCKED)
    assert not is_blocked(ROOMY)
    assert not is_blocked(inst("fits", running=[run("x", 70)], waiting=[wait("q", 320)]))  # 30 - 1 >= 20


def test_room_after_keeps_the_out_threshold_per_request():
    cfg = ReschedulingConfig(out_threshold=3, in_threshold=3)
    assert room_after(ROOMY, 20, cfg) == pytest.approx((90 - 1 - 20) / 2)
    assert room_after(SNUG, 20, cfg) == pytest.approx(3.0)      # (30 - 1 - 20) / 3: at the threshold
    assert room_after(SNUG, 21, cfg) is None                    # 8 / 3 < 3
    assert room_after(BLOCKED, 1, cfg) is None                  # has a queue
    assert room_after(inst("t", term=True), 1, cfg) is None


def test_plan_hol_moves_oldest_head_first_one_destination_each():
    cfg = ReschedulingConfig()
    later = inst("later", running=[run("c", 95)], waiting=[wait("hol2", 160, t=2.0)])
    assert plan_hol_moves([ROOMY, later, BLOCKED], cfg) == [("blocked", "roomy")]
    assert plan_hol_moves([ROOMY, later, BLOCKED, inst("empty")], cfg) == [
        ("blocked", "empty"), ("later", "roomy")]


def test_pairing_with_hol_defrag_and_the_paper_default():
    hol = ReschedulingConfig(defrag="hol")
    paper = ReschedulingConfig()
    # queued: freeness (100 - 1) / 1 = 99 beats roomy's 90, but it has a queue
    queued = inst("queued", waiting=[wait("w", 16)])
    statuses = [BLOCKED, SNUG, ROOMY, queued]

    def pairs(cfg):
        return [(o.src_instance_id, o.dst_instance_id) for o in pair_migrations(statuses, cfg, NO_HEADROOM)]

    assert pairs(paper) == [("blocked", "queued")]    # lowest freeness (-14) with the highest (99)
    assert pairs(hol) == [("blocked", "roomy")]       # room for the HOL, no queue; nothing left to pair
    assert ReschedulingConfig().defrag == "paper"
    with pytest.raises(PolicyConfigError, match="defrag"):
        ReschedulingConfig(defrag="magic")


def test_hol_first_selection_gives_up_the_blocked_head():
    assert select_requests(BLOCKED, "paper") == ["b2"]          # shorter first: 480 < 600 tokens
    assert select_requests(BLOCKED, "paper", hol_first=True) == ["hol"]
    assert select_requests(BLOCKED, "paper", max_n=2, hol_first=True) == ["hol", "b2"]
    assert select_requests(BLOCKED, "paper", hol_first=True, exclude={"hol"}) == ["b2"]
    assert select_requests(ROOMY, "paper", hol_first=True) == ["r1"]  # not blocked: the paper's
