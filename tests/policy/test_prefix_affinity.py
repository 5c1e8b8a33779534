"""Prefix affinity at dispatch (``llumnix`` with ``prefix: true``): the index of what was sent
where, the pick over literal snapshots, and the scheduler sending a prompt back to its prefix."""
from __future__ import annotations

import dataclasses

import pytest

from llumnix.kv.prefix_cache import PrefixCache
from llumnix.policy import DispatchRequest, GlobalScheduler, PolicyConfigError, SchedulingConfig
from llumnix.policy.prefix_affinity import PrefixIndex, PrefixOptions, affinity_pick, block_keys
from tests.policy.snapshots import BS, inst, run, wait


def test_block_keys_are_the_engine_caches_keys():
    prompt = list(range(100, 100 + 3 * BS + 5))  # three full blocks and a partial one
    cache = PrefixCache(BS)
    cache.add("r", [7, 8, 9, 10], prompt, [], num_computed=len(prompt))
    keys = block_keys(prompt, BS)
    assert len(keys) == 3
    assert [cache.by_key[k] for k in keys] == [7, 8, 9]
    assert block_keys(prompt[:BS - 1], BS) == []


def test_index_matches_leading_blocks_only():
    a, b = list(range(4 * BS)), [*range(2 * BS), *range(900, 900 + 2 * BS)]
    index = PrefixIndex()
    index.record("i0", block_keys(a, BS), capacity=100)
    assert index.matches(block_keys(a, BS)) == {"i0": 4}
    assert index.matches(block_keys(b, BS)) == {"i0": 2}  # diverges at block 2
    assert index.matches(block_keys(list(range(500, 600)), BS)) == {}
    index.record("i1", block_keys(b, BS), capacity=100)
    assert index.matches(block_keys(b, BS)) == {"i0": 2, "i1": 4}
    assert index.matches(block_keys(a, BS)) == {"i0": 4, "i1": 2}
    index.remove("i0")
    assert index.matches(block_keys(a, BS)) == {"i1": 2}
    index.remove("i1")
    assert index.matches(block_keys(b, BS)) == {} and index._holders == {}  # nothing left behind


def test_index_forgets_the_least_recent_prompt_from_its_tail():
    old, new = list(range(4 * BS)), list(range(1000, 1000 + 4 * BS))
    index = PrefixIndex()
    index.record("i0", block_keys(old, BS), capacity=6)
    index.record("i0", block_keys(new, BS), capacity=6)
    assert index.size("i0") == 6 and len(index._holders) == 6
    # the old prompt lost its last two blocks, not its first two (which would lose all four)
    assert index.matches(block_keys(old, BS)) == {"i0": 2}
    assert index.matches(block_keys(new, BS)) == {"i0": 4}


def test_index_forgets_evicted_keys_sent_before_the_report_window():
    a = list(range(4 * BS))
    keys = block_keys(a, BS)
    index = PrefixIndex()
    index.record("i0", keys, capacity=100, now=1.0)
    index.record("i1", keys, capacity=100, now=1.0)
    # i0 evicted block 2 after its report at 2.0: matching stops there, the chain's tail
    # stays remembered but unreachable, as in the engine's cache
    assert index.forget_evicted("i0", [keys[2]], since=2.0) == 1
    assert index.matches(keys) == {"i0": 2, "i1": 4}
    # a key sent after the previous report is kept: the eviction may have come first
    index.record("i1", keys, capacity=100, now=3.0)
    assert index.forget_evicted("i1", keys, since=2.5) == 0
    assert index.matches(keys) == {"i0": 2, "i1": 4}
    assert index.forget_evicted("i0", keys, since=2.0) == 3 and index.size("i0") == 0
    assert index.forget_evicted("nope", keys, since=9.0) == 0
    assert index.matches(keys) == {"i1": 4}
    assert index.num_forgotten == {"i0": 4}
    index.remove("i0")
    assert index.num_forgotten == {}


def _busy(iid, n, total=100, waiting=()):
    return inst(iid, total=total, running=[run(f"{iid}-{k}", 2) for k in range(n)], waiting=waiting)


OPTS = PrefixOptions(slack=4, min_tokens=64)


@pytest.mark.parametrize(("cands", "scores", "hits", "expected"), [
    # no hits anywhere: the freest
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], {}, "a"),
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], None, "a"),
    # b holds 8 blocks (128 tokens) of the prompt and one more request: b
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], {"b": 8}, "b"),
    # ... but not with 4 more requests than the least loaded plus one (slack 4)
    ([_busy("a", 1), _busy("b", 6)], [1.0, 0.0], {"b": 8}, "a"),
    ([_busy("a", 1), _busy("b", 5)], [1.0, 0.0], {"b": 8}, "b"),
    # queued requests count: 4 running and 2 queued is 5 more than a's 1 (beyond slack 4)
    ([_busy("a", 1), _busy("b", 4, waiting=[wait("q", 32), wait("q2", 32)])], [1.0, 0.0], {"b": 8}, "a"),
    ([_busy("a", 1), _busy("b", 4, waiting=[wait("q", 32)])], [1.0, 0.0], {"b": 8}, "b"),
    ([_busy("a", 1, waiting=[wait("p", 32)]), _busy("b", 5, waiting=[wait("q", 32)])], [1.0, 0.0], {"b": 8}, "b"),
    # 3 blocks (48 tokens) save less than min_tokens 64 over the freest's none: the freest
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], {"b": 3}, "a"),
    # the gain counts over the freest's own match: 10 against 6 blocks is 64 tokens
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], {"a": 6, "b": 10}, "b"),
    ([_busy("a", 1), _busy("b", 2)], [1.0, 0.0], {"a": 6, "b": 9}, "a"),
    # the longest match wins, then the score, then the id
    ([_busy("a", 0), _busy("b", 1), _busy("c", 1)], [1.0, 0.2, 0.5], {"b": 10, "c": 9}, "b"),
    ([_busy("a", 0), _busy("b", 1), _busy("c", 1)], [1.0, 0.2, 0.5], {"b": 9, "c": 9}, "c"),
    ([_busy("a", 0), _busy("b", 1), _busy("c", 1)], [1.0, 0.5, 0.5], {"b": 9, "c": 9}, "b"),
])
def test_affinity_pick(cands, scores, hits, expected):
    assert affinity_pick(cands, scores, hits, OPTS).instance_id == expected


@pytest.mark.parametrize(("freest_load", "other_load", "expected"), [
    (1, 5, "b"), (1, 6, "a"),        # a light load: the absolute slack of 4 decides
    (10, 25, "b"), (10, 26, "a"),    # 10 requests at the freest: 1.5 x 10 = 15 more allowed
])
def test_the_slack_grows_with_the_freest_candidates_load(freest_load, other_load, expected):
    opts = PrefixOptions(slack=4, slack_ratio=1.5, min_tokens=64)
    cands = [_busy("a", freest_load), _busy("b", other_load)]
    assert affinity_pick(cands, [1.0, 0.0], {"b": 8}, opts).instance_id == expected
    assert affinity_pick(cands, [1.0, 0.0], {"b": 8}, OPTS).instance_id == ("b" if other_load - freest_load <= 4
                                                                          else "a")


def _gs(prefix=True, **params):
    dispatch = {"policy": "llumnix", "pending_grace_s": 0.0, "params": {"prefix": prefix, **params}}
    gs = GlobalScheduler(SchedulingConfig.from_dict({"freeness": {"headroom_tokens": {}},
                                                     "dispatch": dispatch}))
    for i in range(2):
        gs.add_instance(inst(f"i{i}", total=1000))
    return gs


def _send(gs, rid, prompt, now=0.01):
    return gs.dispatch(DispatchRequest(rid, len(prompt), 0, now, prompt), now)


def test_a_shared_prefix_follows_its_first_request():
    system = list(range(10, 10 + 20 * BS))  # a 320-token system prompt
    plain = _gs(prefix=False)
    assert [_send(plain, f"r{k}", [*system, 500 + k]) for k in range(4)] == ["i0", "i1", "i0", "i1"]
    gs = _gs()
    assert _send(gs, "r0", [*system, 500]) == "i0"
    # i1 is freer, but i0 was sent the system prompt: the next four go there too (slack 4)
    assert [_send(gs, f"r{k}", [*system, 500 + k]) for k in range(1, 5)] == ["i0"] * 4
    # i0 now holds 5 requests, i1 none: beyond the slack, so the freest; i1 then has it too
    assert _send(gs, "r5", [*system, 505]) == "i1"
    assert gs.prefix_index.matches(block_keys([*system, 1], BS)) == {"i0": 20, "i1": 20}
    # another prompt is dispatched by freeness alone
    assert _send(gs, "other", list(range(5000, 5400))) == "i1"


@pytest.mark.parametrize("forget", [False, True])
def test_reported_evictions_send_the_prefix_where_it_still_is(forget):
    system = list(range(10, 10 + 20 * BS))
    dispatch = {"policy": "llumnix", "pending_grace_s": 0.0, "params": {"prefix": True},
                "prefix_evictions": forget}
    gs = GlobalScheduler(SchedulingConfig.from_dict({"freeness": {"headroom_tokens": {}}, "dispatch": dispatch}))
    gs.add_instance(inst("i0", total=1000))
    busy = [run("x", 100), run("y", 100)]
    gs.add_instance(inst("i1", total=1000, ts=0.0, running=busy))  # i0 is freer, and stays so
    assert _send(gs, "r0", [*system, 1], now=0.01) == "i0"
    gs.update_status(inst("i1", total=1000, ts=0.02, running=busy))
    gs.prefix_index.record("i1", block_keys([*system, 1], BS), 1000, now=0.01)  # i1 was sent it too
    # i0 reports (after the dispatch) that it evicted the system prompt's blocks
    gs.update_status(dataclasses.replace(inst("i0", total=1000, ts=0.03, running=[run("r0", 21)]),
                                         evicted_prefix_keys=tuple(block_keys(system, BS))))
    gs.update_status(dataclasses.replace(inst("i0", total=1000, ts=0.04, running=[run("r0", 21)]),
                                         evicted_prefix_keys=tuple(block_keys(system, BS))))
    assert gs.prefix_index.matches(block_keys(system, BS)) == ({"i1": 20} if forget else {"i0": 20, "i1": 20})
    # the next request with that prefix: to i0 (freest, and remembered) only without the reports
    assert _send(gs, "r1", [*system, 2], now=0.05) == ("i1" if forget else "i0")


def test_without_tokens_prefix_affinity_dispatches_as_llumnix():
    gs, plain = _gs(), _gs(prefix=False)
    picks = [g.dispatch(DispatchRequest(f"r{k}", 320, 0, 0.01), 0.01) for g in (gs, plain) for k in range(6)]
    assert picks[:6] == picks[6:]
    assert gs.prefix_index.size("i0") == 0


def test_removed_instance_is_forgotten():
    gs = _gs()
    prompt = list(range(10 * BS))
    assert _send(gs, "r0", prompt) == "i0"
    gs.remove_instance("i0")
    assert gs.prefix_index.size("i0") == 0
    assert _send(gs, "r1", prompt) == "i1"


@pytest.mark.parametrize(("params", "field"), [
    ({"prefix": "yes"}, "dispatch.params.prefix"),
    ({"prefix": True, "shield": True}, "dispatch.params.prefix"),
    ({"prefix_slack": 2}, "dispatch.params.prefix_slack"),
    ({"prefix": True, "prefix_slack": -1}, "dispatch.params.prefix_slack"),
    ({"prefix": True, "prefix_min_tokens": 0}, "dispatch.params.prefix_min_tokens"),
    ({"prefix": True, "prefix_slack_ratio": -0.5}, "dispatch.params.prefix_slack_ratio"),
    ({"prefix": True, "prefix_slack_ratio": "1"}, "dispatch.params.prefix_slack_ratio"),
    ({"prefix_slack_ratio": 1.0}, "dispatch.params.prefix_slack_ratio"),
    ({"prefix": True, "prefix_min_tokens": 1.5}, "dispatch.params.prefix_min_tokens"),
])
def test_bad_prefix_params_name_the_field(params, field):
    with pytest.raises(PolicyConfigError) as e:
        GlobalScheduler(SchedulingConfig.from_dict({"dispatch": {"policy": "llumnix", "params": params}}))
    assert field in str(e.value)


@pytest.mark.parametrize("params", [{}, {"prefix_slack_ratio": 1.0}])
def test_the_index_fast_path_picks_as_the_full_pipeline(params):
    """GlobalScheduler answers prefix affinity from its dispatch index plus the matched
    instances; the ``prefix-affinity`` picker over the full pipeline must agree, through
    reports with queues, stale and terminating instances, and repeated prefixes."""
    import random

    rng = random.Random(7)
    fast, full = _gs(**params), _gs(**params)
    full._index = None  # every pick through the pipeline and its picker
    for g in (fast, full):
        for i in range(2, 8):
            g.add_instance(inst(f"i{i}", total=1000))
    prefixes = [list(range(1000 * p, 1000 * p + rng.randint(1, 12) * BS)) for p in range(6)]
    now = 0.0
    for k in range(600):
        now += 0.01
        if k % 7 == 0:
            i = rng.randrange(8)
            s = inst(f"i{i}", total=1000, ts=now - (3.0 if rng.random() < 0.1 else 0.0),
                     running=[run(f"x{i}-{j}", rng.randint(1, 30)) for j in range(rng.randint(0, 9))],
                     waiting=[wait(f"w{i}", 64)] if rng.random() < 0.2 else (),
                     term=rng.random() < 0.05)
            for g in (fast, full):
                g.update_status(s)
        prompt = [*rng.choice(prefixes), *range(rng.randint(0, 40))]
        picks = [_send(g, f"r{k}", prompt, now) for g in (fast, full)]
        assert picks[0] == picks[1], (k, picks)


def test_llm_d_prefix_scorer_weighs_the_matched_fraction():
    """llm-d's default pairs its queue scorer (weight 2) with a prefix-cache scorer (weight 3):
    the instance holding the prompt wins over an idle one until the queue term outweighs it."""
    def gs(weight):
        g = GlobalScheduler(SchedulingConfig.from_dict({"dispatch": {
            "policy": "llm-d", "pending_grace_s": 0.0,
            "params": {"queue_weight": 2.0, "kv_weight": 0.0, "prefix_weight": weight}}}))
        for i in range(2):
            g.add_instance(inst(f"i{i}", total=1000))
        return g

    prompt = list(range(10 * BS))
    g = gs(3.0)
    assert _send(g, "r0", prompt) == "i0"
    g.update_status(inst("i0", total=1000, waiting=[wait("q", 32)], ts=0.02))  # i0 queues one
    assert _send(g, "r1", prompt, now=0.03) == "i0"  # 3 x 1.0 (prefix) beats 2 x 1.0 (queue)
    plain = gs(0.0)
    assert _send(plain, "r0", prompt) == "i0"
    plain.update_status(inst("i0", total=1000, waiting=[wait("q", 32)], ts=0.02))
    assert _send(plain, "r1", prompt, now=0.03) == "i1"
    assert plain.prefix_index is None and g.prefix_index is not None
