"""The split of a migration's wait after its commit (bench/downtime_split.py): literal step
logs, the parts adding up to the wait, and `bench migration`'s arrival streams."""
from __future__ import annotations

import pytest

from llumnix.bench.downtime_split import quantiles, ratios, split_wait, summarize_waits, wait_row
from llumnix.bench.migration_bench import Arrivals
from llumnix.core.errors import LlumnixError

# A destination: decode [0, 0.1), prefill [0.1, 1.1), gap, prefill [1.12, 1.6), decode [1.6, 1.7) (with it)
STEPS = [(0.0, 0.1, False), (0.1, 1.1, True), (1.12, 1.6, True), (1.6, 1.7, False)]


def test_a_commit_inside_a_prefill_waits_for_it_and_the_next_prefill():
    parts = split_wait(0.5, 1.6, STEPS)
    assert parts["boundary"] == pytest.approx(0.6) and parts["boundary_prefill"] == 1.0
    assert parts["prefill"] == pytest.approx(0.48) and parts["num_prefill_steps"] == 1
    assert parts["idle"] == pytest.approx(0.02) and parts["decode"] == 0.0
    assert sum(parts[k] for k in ("boundary", "prefill", "decode", "idle")) == pytest.approx(1.1)


def test_a_commit_inside_a_decode_step_waits_only_for_its_boundary():
    parts = split_wait(0.05, 0.1, STEPS)
    assert parts == {"boundary": pytest.approx(0.05), "prefill": 0.0, "decode": 0.0, "idle": 0.0,
                     "boundary_prefill": 0.0, "num_prefill_steps": 0.0}


def test_a_decode_step_without_the_request_is_counted_apart():
    # committed at 0.0 exactly (no step in flight: 0.0 is a step's start) and resumed at 1.12
    parts = split_wait(0.0, 1.12, STEPS)
    assert parts["boundary"] == 0.0
    assert parts["decode"] == pytest.approx(0.1) and parts["prefill"] == pytest.approx(1.0)
    assert parts["idle"] == pytest.approx(0.02)


def test_a_commit_between_steps_is_idle_time():
    parts = split_wait(1.105, 1.12, STEPS)
    assert parts["boundary"] == 0.0 and parts["idle"] == pytest.approx(0.015)


def test_resumed_before_the_commit_is_refused():
    with pytest.raises(ValueError):
        split_wait(1.0, 0.5, STEPS)


def test_rows_summarize_into_distributions_and_the_long_waits_make_up():
    rows = [wait_row(0.45, 0.5, 1.6, STEPS), wait_row(0.0, 0.05, 0.1, STEPS)]
    assert rows[0]["downtime"] == pytest.approx(1.15) and rows[0]["before_commit"] == pytest.approx(0.05)
    s = summarize_waits(rows)
    assert s["wait"]["n"] == 2 and s["wait"]["max"] == pytest.approx(1.1)
    assert s["long_waits"]["num"] == 1 and s["long_waits"]["behind_a_prefill_in_flight"] == 1
    assert sum(s["long_waits"]["share"].values()) == pytest.approx(1.0)
    assert s["num_with_decode_steps_without_it"] == 0


def test_quantiles_and_ratios():
    q = quantiles([0.1, 0.2, 0.3, 0.4, 1.0])
    assert (q["n"], q["p50"], q["max"]) == (5, pytest.approx(0.3), 1.0)
    assert quantiles([]) == {"n": 0}
    r = ratios({"wait": {"p50": 0.12, "p99": 0.5}}, {"wait": {"p50": 0.1, "p99": 0.0}}, keys=("wait",))
    assert r == {"wait_p50": pytest.approx(1.2), "wait_p99": None}


def test_arrival_streams_are_seeded_per_instance():
    a = Arrivals.parse("2:128:8")
    assert (a.rate, a.prompt, a.output) == (2.0, 128, 8)
    plan = a.plan(3, ("src", "dst"), horizon_s=100.0)
    assert plan == a.plan(3, ("src", "dst"), horizon_s=100.0) and plan != a.plan(4, ("src", "dst"), 100.0)
    assert [t for t, _ in plan] == sorted(t for t, _ in plan) and plan[-1][0] < 100.0
    per = {n: sum(1 for _, m in plan if m == n) for n in ("src", "dst")}
    assert 140 < per["src"] < 260 and 140 < per["dst"] < 260  # 200 expected each
    for bad in ("0", "x", "1:0", "1:2:3:4", "1:2.5"):
        with pytest.raises(LlumnixError):
            Arrivals.parse(bad)
