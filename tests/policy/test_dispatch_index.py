"""DispatchIndex: the incremental pick is the full pipeline's pick, decision for decision."""
from __future__ import annotations

import dataclasses
import random

import pytest

from llumnix.policy import DispatchRequest, GlobalScheduler, SchedulingConfig, make_pipeline
from llumnix.policy.dispatch_index import DispatchIndex
from llumnix.policy.pipeline import KEYS, Pipeline, register_key
from tests.policy.snapshots import inst, run, wait

INDEXED = [("llumnix", {}), ("llumnix", {"queued": "all"}), ("infaas++", {}),
           ("infaas++", {"metric": "freeness"}), ("round-robin", {}), ("least-requests", {})]


def _pair(policy: str, params: dict, staleness: float) -> tuple[GlobalScheduler, GlobalScheduler]:
    cfg = SchedulingConfig.from_dict({"freeness": {"headroom_tokens": {1: 320}},
                                      "dispatch": {"policy": policy, "params": params,
                                                   "staleness_s": staleness, "pending_grace_s": 0.5}})
    fast, full = GlobalScheduler(cfg, seed=3), GlobalScheduler(cfg, seed=3)
    assert fast._index is not None
    full._index = None  # every dispatch through the whole pipeline
    return fast, full


def _random_status(rng: random.Random, i: int, now: float) -> object:
    running = [run(f"i{i}-r{j}", rng.randint(1, 12), prio=rng.choice((0, 0, 1)))
               for j in range(rng.randint(0, 5))]
    waiting = [wait(f"i{i}-w{j}", rng.randint(1, 300)) for j in range(rng.choice((0, 0, 1, 3)))]
    return inst(f"i{i}", total=rng.choice((60, 100)), running=running, waiting=waiting,
                ts=now - rng.choice((0.0, 0.0, 0.0, 5.0)),  # some reports are stale
                term=rng.random() < 0.1, sched=rng.random() > 0.1, reserved=rng.choice((0, 0, 4)))


@pytest.mark.parametrize(("policy", "params"), INDEXED)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_pick_equals_the_full_pipeline(policy, params, seed):
    rng = random.Random(seed)  # fixed: str hashes are salted per process
    fast, full = _pair(policy, params, staleness=2.0)
    now, decisions = 10.0, 0
    for i in range(6):
        s = _random_status(rng, i, now)
        fast.add_instance(s)
        full.add_instance(s)
    for k in range(600):
        op = rng.random()
        if op < 0.25:
            s = _random_status(rng, rng.randrange(6), now)
            fast.update_status(s)
            full.update_status(s)
        elif op < 0.28:
            iid = f"i{rng.randrange(6)}"
            fast.mark_terminating(iid)
            full.mark_terminating(iid)
        elif op < 0.31:
            iid, ok = f"i{rng.randrange(6)}", rng.random() < 0.5
            fast.set_schedulable(iid, ok)
            full.set_schedulable(iid, ok)
        else:
            req = DispatchRequest(f"q{k}", rng.randint(1, 400), rng.choice((0, 1)), now)
            a, b = fast.dispatch(req, now), full.dispatch(req, now)
            assert a == b, f"step {k}: index picked {a}, pipeline {b}"
            decisions += a is not None
        now += rng.choice((0.001, 0.01, 0.5))
    # the comparison covered real decisions, not only refusals (these seeds give 113-419)
    assert decisions > 100
    assert fast.view() == full.view()


@pytest.mark.parametrize(("policy", "params"), INDEXED)
def test_keys_deferred_past_a_rescheduling_read_decide_as_the_pipeline(policy, params):
    # The simulator's reports: refresh=False, and rescheduling rounds (view()) rebuild the
    # views between dispatches without the dispatch keys; the next dispatch must rebuild
    # those keys, or it would pick from keys older than the views.
    rng = random.Random(7)
    fast, full = _pair(policy, params, staleness=2.0)
    now, decisions = 10.0, 0
    for i in range(6):
        s = _random_status(rng, i, now)
        fast.add_instance(s)
        full.add_instance(s)
    for k in range(600):
        op = rng.random()
        if op < 0.4:
            s = _random_status(rng, rng.randrange(6), now)
            fast.update_status(s, refresh=False)
            full.update_status(s)
        elif op < 0.6:
            assert fast.view() == full.view()  # a rescheduling round's read
        else:
            req = DispatchRequest(f"q{k}", rng.randint(1, 400), rng.choice((0, 1)), now)
            a, b = fast.dispatch(req, now), full.dispatch(req, now)
            assert a == b, f"step {k}: index picked {a}, pipeline {b}"
            decisions += a is not None
        now += rng.choice((0.001, 0.01, 0.5))
    assert decisions > 50


@pytest.mark.parametrize(("policy", "params"), [("llm-d", {}), ("random", {}), ("power-of-two", {}),
                                                ("llumnix", {"tie_break": "random"})])
def test_policies_the_index_cannot_answer_use_the_pipeline(policy, params):
    assert not DispatchIndex.supports(make_pipeline(policy, params))


def test_stale_winner_falls_back_to_the_pipeline_rule():
    fast, full = _pair("llumnix", {}, staleness=1.0)
    for gs in (fast, full):
        gs.add_instance(inst("i0", ts=0.0))                            # freest, but stale at t=5
        gs.add_instance(inst("i1", running=[run("a", 50)], ts=4.9))   # fresh
    req = DispatchRequest("r", 16, 0, 5.0)
    assert fast.dispatch(req, 5.0) == full.dispatch(req, 5.0) == "i1"


def test_an_infinite_best_metric_is_left_to_the_pipeline():
    # Clamping makes +inf tie with the best finite score, which the raw order cannot see.
    if "test-extra-blocks" not in KEYS:
        @register_key("test-extra-blocks", higher_is_better=True)
        def _extra(s, ctx):
            return s.extra["blocks"]

    pipe = Pipeline(filters=("schedulable",), scorers=(("test-extra-blocks", 1.0),))
    for use_index in (True, False):
        gs = GlobalScheduler(SchedulingConfig())
        gs.pipeline, gs._index = pipe, (DispatchIndex(pipe) if use_index else None)
        gs.add_instance(dataclasses.replace(inst("i1"), extra={"blocks": float("inf")}))
        gs.add_instance(dataclasses.replace(inst("i0"), extra={"blocks": 7.0}))
        assert gs.dispatch(DispatchRequest("r", 16, 0, 0.0), 0.0) == "i0"  # both score 1: lowest id
