"""policy/pd.py: the PD config, hand-off destinations and adaptive PD's decisions on
literal snapshots."""
from __future__ import annotations

import pytest

from llumnix.config import SystemConfig, SystemConfigError
from llumnix.policy import SchedulingConfig
from llumnix.policy.config import PolicyConfigError
from llumnix.policy.freeness import freeness
from llumnix.policy.pd import (
    PDConfig,
    PoolView,
    RoleChange,
    adaptive_decisions,
    initial_roles,
    pick_decode_instance,
    queued_prefill_tokens,
)
from tests.policy.snapshots import NO_HEADROOM, inst, run, wait

ADAPTIVE = PDConfig(mode="adaptive", prefill_instances=2, lend_above_tokens=4000, reclaim_below_tokens=1000,
                    decode_room_freeness=10, decode_tight_freeness=2, flip_after_s=5, cooldown_s=1)


def _free(s):
    return freeness(s, NO_HEADROOM)


@pytest.mark.parametrize(("doc", "path"), [
    ({"mode": "split"}, "pd.mode"),
    ({"prefill_instances": 0}, "pd.prefill_instances"),
    ({"lend_above_tokens": 100, "reclaim_below_tokens": 200}, "pd.reclaim_below_tokens"),
    ({"decode_room_freeness": 1, "decode_tight_freeness": 5}, "pd.decode_tight_freeness"),
    ({"cooldown_s": -1}, "pd.cooldown_s"),
    ({"max_handoffs_in_flight": 0}, "pd.max_handoffs_in_flight"),
    ({"bogus": 1}, "pd.bogus"),
])
def test_bad_pd_values_are_one_line_errors_naming_the_path(doc, path):
    with pytest.raises(PolicyConfigError) as e:
        SchedulingConfig.from_dict({"pd": doc})
    assert str(e.value).count("\n") == 0 and path in str(e.value)


def test_serve_spelling_takes_the_same_keys_and_names_the_full_path():
    cfg = SystemConfig.from_dict({"scheduling": {"pd": {"mode": "static", "prefill_instances": 3}}})
    assert cfg.scheduling.pd == PDConfig(mode="static", prefill_instances=3)
    with pytest.raises(SystemConfigError, match=r"^scheduling\.pd\.mode: "):
        SystemConfig.from_dict({"scheduling": {"pd": {"mode": "both"}}})


def test_both_pools_must_be_non_empty():
    PDConfig(mode="static", prefill_instances=15).check_instances(16)
    PDConfig(mode="off", prefill_instances=16).check_instances(16)  # off: not checked
    with pytest.raises(PolicyConfigError, match="pd.prefill_instances: must be between 1 and 15"):
        PDConfig(mode="static", prefill_instances=16).check_instances(16)


def test_initial_roles():
    ids = ["i0", "i1", "i2", "i3"]
    assert initial_roles(ids, PDConfig()) == dict.fromkeys(ids, "mixed")
    assert initial_roles(ids, PDConfig(mode="static", prefill_instances=1)) == {
        "i0": "prefill", "i1": "decode", "i2": "decode", "i3": "decode"}


def test_queued_prefill_tokens_counts_the_queue_and_prefills_without_a_first_token():
    from dataclasses import replace

    decoding = replace(run("a", 4, tokens=60), num_output_tokens=3)
    prefilling = run("b", 8, tokens=128)  # no output yet: a chunked prefill in progress
    s = inst("p", running=[decoding, prefilling], waiting=[wait("c", 500), wait("d", 20)])
    assert queued_prefill_tokens(s) == 128 + 500 + 20


def test_hand_off_goes_to_the_freest_decode_instance_with_room():
    roles = {"p": "prefill", "d1": "decode", "d2": "decode", "m": "mixed"}
    statuses = [inst("p"), inst("d1", running=[run("x", 50)]), inst("d2", running=[run("y", 20)]),
                inst("m", running=[run("z", 90)])]
    cfg = PDConfig(mode="static")
    assert pick_decode_instance(statuses, roles, 10, cfg, _free) == "d2"
    # d2 was promised 75 blocks since its report: only d1 still fits 10 + 1 growth
    assert pick_decode_instance(statuses, roles, 10, cfg, _free, promised={"d2": 75}) == "d1"
    # d2 has 80 free, 79 beyond the watermark: 78 + 1 fits, 79 + 1 does not (the pool is full)
    assert pick_decode_instance(statuses, roles, 78, cfg, _free) == "d2"
    assert pick_decode_instance(statuses, roles, 79, cfg, _free) is None
    # a prefill instance is never a destination, a terminating or unschedulable one neither
    only_prefill_free = [inst("p"), inst("d1", running=[run("x", 98)]), inst("d2", term=True), inst("m", sched=False)]
    assert pick_decode_instance(only_prefill_free, roles, 5, cfg, _free) is None


def _view(roles, queued, free, since=None):
    return PoolView(roles, since or {}, queued, free)


def test_lend_when_the_prefill_queue_grows_and_the_decode_pool_has_room():
    roles = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode", "d3": "decode"}
    v = _view(roles, {"p1": 5000, "p2": 4000}, {"d1": 20, "d2": 40, "d3": 15})
    assert adaptive_decisions(v, ADAPTIVE, 10.0, None) == [RoleChange("d2", "mixed", "lend")]
    # within the cooldown: nothing
    assert adaptive_decisions(v, ADAPTIVE, 10.0, 9.5) == []
    # no room in the decode pool: nothing is lent
    tight = _view(roles, {"p1": 5000, "p2": 4000}, {"d1": 5, "d2": 8, "d3": 1})
    assert adaptive_decisions(tight, ADAPTIVE, 10.0, None) == []
    # static mode never changes roles
    static = PDConfig(mode="static", prefill_instances=2)
    assert adaptive_decisions(v, static, 10.0, None) == []


def test_a_lent_instance_flips_to_prefill_when_still_needed_and_is_reclaimed_when_not():
    roles = {"p1": "prefill", "m": "mixed", "d1": "decode", "d2": "decode"}
    high = {"p1": 9000, "m": 6000}
    v = _view(roles, high, {"d1": 20, "d2": 20, "m": 3}, since={"m": 1.0})
    assert adaptive_decisions(v, ADAPTIVE, 7.0, None) == [RoleChange("m", "prefill", "flip")]
    assert adaptive_decisions(v, ADAPTIVE, 5.0, None) == [RoleChange("d2", "mixed", "lend")]  # lent 4 s only
    low = _view(roles, {"p1": 100, "m": 0}, {"d1": 20, "d2": 20, "m": 3}, since={"m": 1.0})
    assert adaptive_decisions(low, ADAPTIVE, 7.0, None) == [RoleChange("m", "decode", "reclaim")]


def test_a_prefill_instance_flips_to_decode_when_the_decode_pool_is_tight_and_prefill_idle():
    roles = {"p1": "prefill", "p2": "prefill", "d1": "decode"}
    v = _view(roles, {"p1": 300, "p2": 0}, {"d1": 1.0})
    assert adaptive_decisions(v, ADAPTIVE, 3.0, None) == [RoleChange("p2", "decode", "flip")]
    # the last prefill instance stays (min_prefill)
    one = _view({"p1": "prefill", "d1": "decode"}, {"p1": 0}, {"d1": 1.0})
    assert adaptive_decisions(one, ADAPTIVE, 3.0, None) == []


def test_hand_offs_waiting_for_room_block_lending_and_pull_a_prefill_instance_to_decode():
    roles = {"p1": "prefill", "p2": "prefill", "d1": "decode", "d2": "decode", "d3": "decode"}
    busy = PoolView(roles, {}, {"p1": 5000, "p2": 4000}, {"d1": 20, "d2": 40, "d3": 15}, num_waiting_handoffs=3)
    assert adaptive_decisions(busy, ADAPTIVE, 10.0, None) == []  # roomy by freeness, but full for hand-offs
    idle = PoolView(roles, {}, {"p1": 200, "p2": 0}, {"d1": 20, "d2": 40, "d3": 15}, num_waiting_handoffs=3)
    assert adaptive_decisions(idle, ADAPTIVE, 10.0, None) == [RoleChange("p2", "decode", "flip")]
