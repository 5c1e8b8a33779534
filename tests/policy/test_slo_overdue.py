"""Overdue requests (``scheduling.slo.engine_order``): what the engines serve last is what
the predictor leaves out of a newcomer's wait, and rescue reads the rest in order."""
from __future__ import annotations

import pytest

from llumnix.core.request import Priority
from llumnix.policy import SchedulingConfig
from llumnix.policy.slo import SLOConfig
from llumnix.policy.slo_predict import SLOPredictor
from llumnix.policy.slo_rescue import ttft_rescues
from tests.policy.snapshots import inst, run, wait

HIGH, NORMAL = int(Priority.HIGH), int(Priority.NORMAL)


def test_the_engines_objectives_are_each_class_by_name_and_overdue_needs_an_order() -> None:
    assert SLOConfig().engine_order == "deadline"
    assert SLOConfig().objectives() == {"interactive": (1.0, 0.1), "batch": (10.0, 0.3)}
    assert SLOConfig().classes_of() == {HIGH: "interactive", NORMAL: "batch"}
    assert SLOConfig().overdue_limits() == SLOConfig(engine_order="overdue").overdue_limits() == {
        "interactive": 1.0, "batch": 10.0}
    assert SLOConfig(engine_order="fcfs").overdue_limits() == {}
    two_normal = SLOConfig(classes={"a": {"ttft_s": 2, "tpot_s": 1}, "b": {"ttft_s": 5, "tpot_s": 3}},
                           default_class="a")
    # both classes keep their objectives; a request that names none is the first of its priority's
    assert two_normal.objectives() == {"a": (2.0, 1.0), "b": (5.0, 3.0)}
    assert two_normal.classes_of() == {NORMAL: "a"}
    assert two_normal.class_of("b", NORMAL).ttft_s == 5.0 and two_normal.class_of("", NORMAL).name == "a"


def test_an_unknown_engine_order_is_refused() -> None:
    from llumnix.policy.config import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="slo.engine_order.*fcfs, overdue, deadline"):
        SLOConfig(engine_order="lifo")


def _queue(ts: float) -> object:
    # two 3,000-token batch prompts queued since 0 s, overdue after 10 s
    running = [run(f"r{i}", 20, 300, NORMAL) for i in range(4)]
    return inst("a", total=4000, ts=ts, running=running,
                waiting=[wait("old0", 3000, NORMAL, 0.0), wait("old1", 3000, NORMAL, 0.0)])


def test_a_newcomer_does_not_wait_for_the_overdue_but_shares_their_decodes() -> None:
    on, off = SLOPredictor(SLOConfig()), SLOPredictor(SLOConfig(engine_order="fcfs"))
    early, late = _queue(5.0), _queue(12.0)
    # at 5 s the queue is on time: a newcomer waits for it either way
    assert on.ttft(on.load(early), 200, NORMAL) == pytest.approx(off.ttft(off.load(early), 200, NORMAL))
    # at 12 s it is overdue: served after the newcomer, whose wait is only its own prefill
    lon, loff = on.load(late), off.load(late)
    assert lon.queued == () and lon.overdue == ((NORMAL, 3000), (NORMAL, 3000))
    assert on.ttft(lon, 200, NORMAL) < 0.5 * off.ttft(loff, 200, NORMAL)
    # they still join the batch the newcomer decodes in
    assert on.tpot(lon, 200, 20.0) == pytest.approx(off.tpot(loff, 200, 20.0))


def test_ttft_rescue_reads_the_queue_past_an_overdue_request_not_yet_moved_last() -> None:
    # the engine moves "late" behind the rest at its next step; the status still shows it first.
    # q0 (waited 0.5 s of its 1 s) sits behind 1.5 s of on-time prefill: it moves to idle b
    late = wait("late", 3000, HIGH, -30.0)
    a = inst("a", total=4000, ts=1.0, running=[run("r", 7, 100, NORMAL)],
             waiting=[late, wait("p0", 3000, HIGH, 0.4), wait("p1", 3000, HIGH, 0.4), wait("q0", 200, HIGH, 0.5)])
    b = inst("b", total=4000, ts=1.0, running=[run("s", 7, 100, NORMAL)])
    pred = SLOPredictor(SLOConfig())
    orders = ttft_rescues([a, b], pred, 1.0, SchedulingConfig().rescheduling, set())
    assert [(o.src_instance_id, o.dst_instance_id, o.request_id) for o in orders] == [("a", "b", "q0")]
    # with only the overdue one ahead, q0 holds where it is
    alone = inst("a", total=4000, ts=1.0, running=[run("r", 7, 100, NORMAL)], waiting=[late, wait("q0", 200, HIGH, 0.5)])
    assert ttft_rescues([alone, b], pred, 1.0, SchedulingConfig().rescheduling, set()) == []


def test_a_newcomer_waits_only_for_the_queued_requests_of_its_priority_due_before_it() -> None:
    from dataclasses import replace

    # two classes at one priority; three long "jobs" prompts queued at 0 s (due at 10 s)
    two = {"classes": {"chat": {"ttft_s": 1.0, "tpot_s": 0.1}, "jobs": {"ttft_s": 10.0, "tpot_s": 0.3}},
           "default_class": "jobs"}
    queue = [replace(wait(f"j{i}", 3000, NORMAL, 0.0), slo_class="jobs") for i in range(3)]
    a = inst("a", total=4000, ts=1.0, running=[run("r", 7, 100, NORMAL)], waiting=queue)
    pred = SLOPredictor(SLOConfig(**two))
    load = pred.load(a)
    chat, jobs, plain = pred.ttft(load, 200, NORMAL, 1.0 + 1.0), pred.ttft(load, 200, NORMAL, 1.0 + 10.0), \
        pred.ttft(load, 200, NORMAL)
    assert chat < 0.2 * jobs  # the engine serves the chat request first: only its own prefill
    assert jobs == pytest.approx(plain)  # a jobs newcomer (due at 11 s) waits for all three
    fcfs = SLOPredictor(SLOConfig(**two, engine_order="fcfs"))  # arrival order: it waits too
    assert fcfs.ttft(fcfs.load(a), 200, NORMAL, 2.0) == pytest.approx(plain)
