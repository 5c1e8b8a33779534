"""Latency objectives in the local scheduler (``set_objectives``, ``engine/objectives.py``):
overdue requests go last, the queue and preemption follow deadlines."""
from __future__ import annotations

import pytest

from llumnix.core.request import Priority
from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine


def by_priority(eng, limits: dict[int, tuple[float, float]], order: str = "deadline") -> None:
    """Objectives per priority: a class per priority, which a request that names none gets."""
    eng.set_objectives({f"p{p}": v for p, v in limits.items()}, order, {p: f"p{p}" for p in limits})


def finish_order(eng) -> list[str]:
    order = []
    while eng.has_unfinished_requests():
        order += [o.request_id for o in eng.step() if o.is_finished]
        eng.check_invariants()
    return order


def queued_three(eng) -> None:
    """At 10 s, four requests for one slot: normal "old" (arrived at 0 s), "a" (9 s) and
    "busy" (9.9 s), and high "h" (5 s)."""
    eng.add_request("busy", [1, 2], SamplingParams(max_tokens=3), arrival_time=9.9)
    eng.add_request("old", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.0)
    eng.add_request("a", [1, 2], SamplingParams(max_tokens=1), arrival_time=9.0)
    eng.add_request("h", [1, 2], SamplingParams(max_tokens=1), priority=Priority.HIGH, arrival_time=5.0)


def test_a_request_queued_past_its_limit_is_served_after_the_ones_that_are_not():
    plain = make_engine(max_num_seqs=1)
    plain.clock.advance_to(10.0)
    queued_three(plain)
    assert finish_order(plain) == ["h", "old", "a", "busy"]  # priority, then arrival

    eng = make_engine(max_num_seqs=1)
    eng.clock.advance_to(10.0)
    by_priority(eng, {int(Priority.NORMAL): (5.0, 1.0), int(Priority.HIGH): (1.0, 1.0)}, "overdue")
    queued_three(eng)
    # at 10 s: "old" (normal, 10 s waited > 5) and "h" (high, 5 s > 1) are overdue; "a" and "busy" are not
    assert finish_order(eng) == ["a", "busy", "h", "old"]
    assert eng.scheduler.num_overdue == 2


def test_nothing_is_overdue_before_its_limit_and_priorities_not_named_never_are():
    eng = make_engine(max_num_seqs=1)
    eng.clock.advance_to(10.0)
    by_priority(eng, {int(Priority.HIGH): (100.0, 1.0)})  # normal: no objectives
    queued_three(eng)
    assert finish_order(eng) == ["h", "old", "a", "busy"]
    assert eng.scheduler.num_overdue == 0


def test_a_request_becomes_overdue_while_it_waits():
    eng = make_engine(max_num_seqs=1)
    by_priority(eng, {int(Priority.NORMAL): (1.0, 1.0)}, "overdue")
    eng.add_request("first", [1, 2], SamplingParams(max_tokens=5), arrival_time=0.0)
    eng.add_request("second", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.0)
    eng.step()  # "first" runs; "second" waits, on time
    assert [r.request_id for r in eng.scheduler.waiting] == ["second"]
    eng.clock.advance_to(0.5)
    eng.add_request("third", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.5)
    assert [r.request_id for r in eng.scheduler.waiting] == ["second", "third"]
    eng.clock.advance_to(1.2)  # "second" waited 1.2 s (> 1): overdue; "third" 0.7 s: not
    assert finish_order(eng) == ["first", "third", "second"]


def test_a_preempted_request_that_had_its_first_token_is_not_overdue():
    # 10 blocks of 4: a grows until the engine must preempt; it had its first token, so
    # whatever its age it is no longer waiting for one
    eng = make_engine(num_blocks=10, block_size=4)
    by_priority(eng, {int(Priority.NORMAL): (0.5, 1.0)}, "overdue")
    eng.add_request("old", [1] * 8, SamplingParams(max_tokens=30), arrival_time=0.0)
    eng.add_request("new", [2] * 8, SamplingParams(max_tokens=30), arrival_time=0.1)
    eng.step()
    eng.clock.advance_to(5.0)
    preempted = run_steps(eng, 20, dt=0.0, until_preempted=True)
    assert preempted == ["new"]
    assert not eng.get_request("new").is_overdue


def test_an_overdue_running_request_is_preempted_before_an_on_time_one():
    eng = make_engine(num_blocks=10, block_size=4, max_num_seqs=8)
    by_priority(eng, {int(Priority.NORMAL): (1.0, 1.0)}, "overdue")
    eng.add_request("late", [1] * 8, SamplingParams(max_tokens=30), arrival_time=0.0)
    eng.clock.advance_to(2.0)  # "late" waited 2 s before its first step
    eng.add_request("fresh", [2] * 8, SamplingParams(max_tokens=30), arrival_time=1.9)
    eng.step()  # both admitted: "fresh" first (on time), then "late"
    assert eng.get_request("late").is_overdue
    preempted = run_steps(eng, 20, dt=0.0, until_preempted=True)
    # without the limits the most recent arrival ("fresh") would be the victim
    assert preempted == ["late"]


def run_steps(eng, n: int, dt: float = 0.01, until_preempted: bool = False) -> list[str]:
    """``n`` steps ``dt`` apart (``until_preempted``: or fewer, up to the first that
    preempts); the requests preempted in them."""
    preempted: list[str] = []
    for _ in range(n):
        batch = eng.schedule()
        preempted += batch.preempted_request_ids
        if batch.scheduled:
            eng.update(batch, eng.executor.execute(batch))
        eng.check_invariants()
        if until_preempted and preempted:
            break
        eng.clock.advance_to(eng.clock.now() + dt)
    return preempted


def two_running(ttft: float, chunked: bool = False):
    """20 blocks of 4 tokens, two requests decoding at 0.23 s: "long" (8-token prompt at 0 s,
    22 tokens made: 30 tokens, 8 blocks), on pace until 0 s + 22 x its 1 s TPOT; "young"
    (32-token prompt at 0.21 s, 2 tokens: 9 blocks), on pace until 2.21 s. 3 blocks free."""
    eng = make_engine(num_blocks=20, block_size=4, max_num_seqs=8, chunked=chunked)
    by_priority(eng, {int(Priority.NORMAL): (ttft, 1.0)})
    eng.add_request("long", [1] * 8, SamplingParams(max_tokens=60), arrival_time=0.0)
    assert run_steps(eng, 21) == []
    eng.add_request("young", [4] * 32, SamplingParams(max_tokens=40), arrival_time=eng.clock.now())
    assert run_steps(eng, 2) == []
    assert eng.kv.num_free_blocks == 3
    return eng


def test_a_queued_first_token_takes_the_blocks_of_a_request_far_ahead_of_its_pace():
    eng = two_running(10.0)
    now = eng.clock.now()
    # 4 blocks, waited 6 s (urgent: past half its 10 s), due at now + 4 s
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=now - 6)
    eng.add_request("later", [3] * 16, SamplingParams(max_tokens=2), arrival_time=now - 6)
    batch = eng.schedule()
    assert batch.is_prefill and batch.preempted_request_ids == ["long"]  # not "young": due before them
    assert [e.request_id for e in batch.scheduled] == ["new", "later"]
    assert eng.scheduler.deadlines.num_preempted == 1
    assert [r.request_id for r in eng.scheduler.waiting] == ["long"]  # due after them, it waits
    eng.update(batch, eng.executor.execute(batch))
    eng.check_invariants()


def test_with_chunked_prefill_a_queued_first_token_takes_the_blocks_before_the_decodes_are_taken():
    """A chunked engine admits after the step's decodes are in it, so the head preempts first
    (``DeadlinePreemption.for_head``): before it, the deadline order never preempted on a chunked engine
    (issue 47's fair point: 24 of 28 interactive misses, benchmarks/slo/fair_misses.py)."""
    eng = two_running(10.0, chunked=True)
    now = eng.clock.now()
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=now - 6)
    batch = eng.schedule()
    assert batch.preempted_request_ids == ["long"]  # not "young": due before "new"
    assert [e.request_id for e in batch.scheduled] == ["young", "new"]  # young's decode, new's prefill
    assert batch.num_decodes == 1 and eng.scheduler.deadlines.num_preempted == 1
    assert [r.request_id for r in eng.scheduler.waiting] == ["long"]
    eng.update(batch, eng.executor.execute(batch))
    eng.check_invariants()
    assert finish_order(eng)  # and the rest runs to its end, invariants checked each step


def test_with_chunked_prefill_nothing_is_preempted_before_the_head_is_urgent_or_without_objectives():
    eng = two_running(10.0, chunked=True)
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=eng.clock.now() - 4)
    assert run_steps(eng, 1, dt=1.0) == []  # waited 4 s of 10: memory may yet free by itself
    assert run_steps(eng, 1) == ["long"]  # 5 s: urgent
    eng = two_running(10.0, chunked=True)
    eng.set_objectives({}, "fcfs")  # the plain order: a blocked head waits for memory
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=eng.clock.now() - 6)
    assert run_steps(eng, 3) == [] and [r.request_id for r in eng.scheduler.waiting] == ["new"]


def test_no_request_is_preempted_for_one_due_later_or_when_its_blocks_would_not_do():
    eng = two_running(30.0)  # due at now + 30 s, after "long"'s 22 s
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=eng.clock.now())
    assert run_steps(eng, 1) == [] and [r.request_id for r in eng.scheduler.waiting] == ["new"]
    eng = two_running(10.0)  # 12 blocks: "long"'s 8 and the 3 free would not do
    eng.add_request("huge", [2] * 48, SamplingParams(max_tokens=2), arrival_time=eng.clock.now() - 6)
    assert run_steps(eng, 1) == [] and [r.request_id for r in eng.scheduler.waiting] == ["huge"]


def test_a_first_token_takes_its_own_prioritys_blocks_once_urgent_and_lower_ones_at_once():
    eng = two_running(10.0)
    eng.add_request("new", [2] * 16, SamplingParams(max_tokens=2), arrival_time=eng.clock.now() - 4)
    assert run_steps(eng, 1, dt=1.0) == []  # waited 4 s of 10: memory may yet free by itself
    assert run_steps(eng, 1) == ["long"]  # 5 s: urgent
    eng = two_running(10.0)
    by_priority(eng, {int(Priority.NORMAL): (10.0, 1.0), int(Priority.HIGH): (1.0, 0.1)})
    eng.add_request("chat", [2] * 16, SamplingParams(max_tokens=2), priority=Priority.HIGH,
                    arrival_time=eng.clock.now())
    assert eng.schedule().preempted_request_ids == ["long"]  # lower priority: at once, latest due first


def test_fcfs_order_is_the_plain_order():
    eng = make_engine(max_num_seqs=1)
    eng.clock.advance_to(10.0)
    by_priority(eng, {int(Priority.NORMAL): (5.0, 1.0), int(Priority.HIGH): (1.0, 1.0)}, "fcfs")
    queued_three(eng)
    assert eng.scheduler.objectives is None
    assert finish_order(eng) == ["h", "old", "a", "busy"]


def test_an_unknown_order_is_refused():
    import pytest

    from llumnix.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="fcfs, overdue, deadline"):
        by_priority(make_engine(), {0: (1.0, 1.0)}, "lifo")


def test_two_classes_at_one_priority_are_told_apart_by_name_in_the_queue_and_the_status():
    from llumnix.engine.status_builder import build_status

    eng = make_engine(max_num_seqs=1)
    # both at normal priority; a request that names no class is "jobs" (its priority's)
    eng.set_objectives({"chat": (1.0, 0.1), "jobs": (10.0, 0.3)}, "deadline", {int(Priority.NORMAL): "jobs"})
    eng.clock.advance_to(0.5)
    eng.add_request("job", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.0)  # due at 10 s
    eng.add_request("chat", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.4, slo_class="chat")  # at 1.4 s
    eng.add_request("late", [1, 2], SamplingParams(max_tokens=1), arrival_time=-0.7, slo_class="chat")  # at 0.3 s
    assert eng.requests["job"].slo_class == "jobs"
    # by deadline within the priority: the older job waits for the chat requests due sooner
    assert [r.request_id for r in eng.scheduler.waiting] == ["late", "chat", "job"]
    assert [(b.request_id, b.slo_class) for b in build_status(eng).waiting] == [
        ("late", "chat"), ("chat", "chat"), ("job", "jobs")]
    eng.scheduler.demote_overdue()  # "late" is past its 1 s (chat's), "job" is not past jobs' 10 s
    assert [r.request_id for r in eng.scheduler.waiting] == ["chat", "job", "late"]
    assert finish_order(eng) == ["chat", "job", "late"]
    # the same requests without objectives: arrival order
    plain = make_engine(max_num_seqs=1)
    plain.add_request("job", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.0)
    plain.add_request("chat", [1, 2], SamplingParams(max_tokens=1), arrival_time=0.4, slo_class="chat")
    assert [r.request_id for r in plain.scheduler.waiting] == ["job", "chat"]


def test_objectives_are_keyed_by_class_name():
    import pytest

    from llumnix.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="keyed by SLO class name"):
        make_engine().set_objectives({0: (1.0, 1.0)})


def test_the_status_says_whether_a_queue_head_may_preempt_by_deadline():
    """The latency predictor reads it (``policy/slo_predict.py``): only the deadline order
    preempts, and not with prefix caching (a victim's blocks may be the head's prefix)."""
    limits = {int(Priority.NORMAL): (5.0, 1.0)}
    cases = [(None, False, False), ("deadline", False, True), ("overdue", False, False), ("deadline", True, False)]
    for order, caching, expected in cases:
        eng = make_engine(prefix_caching=caching)
        if order is not None:
            by_priority(eng, limits, order)
        assert eng.get_status().preempts_for_deadlines is expected, (order, caching)


def full_batch(chunked: bool = False, caching: bool = False):
    """Two normal requests fill a batch of two (plenty of memory); objectives per priority."""
    eng = make_engine(num_blocks=64, max_num_seqs=2, chunked=chunked, prefix_caching=caching)
    by_priority(eng, {int(Priority.NORMAL): (10.0, 1.0), int(Priority.HIGH): (1.0, 0.1)})
    eng.add_request("early", [1] * 8, SamplingParams(max_tokens=30), arrival_time=0.0)
    eng.add_request("late", [1] * 8, SamplingParams(max_tokens=30), arrival_time=0.5)
    assert run_steps(eng, 3) == [] and len(eng.scheduler.running) == 2
    return eng


def test_a_first_token_takes_a_place_in_a_full_batch_from_a_lower_priority():
    """The batch cap, not memory, stops the head: it preempts for a place as for blocks (the
    running request due last goes), with and without chunked prefill; not with prefix caching, and not a
    request of its own priority before it is urgent."""
    for chunked in (False, True):
        eng = full_batch(chunked)
        eng.add_request("chat", [2] * 8, SamplingParams(max_tokens=2), priority=Priority.HIGH,
                        arrival_time=eng.clock.now())
        obj, running = eng.scheduler.objectives, list(eng.scheduler.running)
        last = max(running, key=obj.key).request_id  # the latest due of the two goes
        batch = eng.schedule()
        assert batch.preempted_request_ids == [last], chunked
        assert "chat" in [e.request_id for e in batch.scheduled]
        assert [r.request_id for r in eng.scheduler.waiting] == [last]
        eng.update(batch, eng.executor.execute(batch))
        eng.check_invariants()
        assert set(finish_order(eng)) == {"early", "late", "chat"}
    eng = full_batch(caching=True)
    eng.add_request("chat", [2] * 8, SamplingParams(max_tokens=2), priority=Priority.HIGH, arrival_time=eng.clock.now())
    assert run_steps(eng, 2) == [] and [r.request_id for r in eng.scheduler.waiting] == ["chat"]
    eng = full_batch()
    eng.add_request("same", [2] * 8, SamplingParams(max_tokens=2), arrival_time=eng.clock.now())
    assert run_steps(eng, 2) == [] and [r.request_id for r in eng.scheduler.waiting] == ["same"]


def test_a_reports_arrival_times_are_on_its_timestamps_clock():
    """The engine stamps arrivals on its own clock (monotonic on a cluster) and the llumlet
    stamps reports with the wall clock dispatch runs on: the briefs come on the report's
    clock, so the SLO predictor reads a queued request's wait, not the gap between two
    clocks (which made every queued request look overdue on a real cluster)."""
    from llumnix.policy.slo import SLOConfig
    from llumnix.policy.slo_predict import SLOPredictor

    eng = make_engine(max_num_seqs=1)
    by_priority(eng, {int(Priority.NORMAL): (10.0, 0.3)})
    eng.clock.advance_to(100.0)  # the engine's clock: 100 s since it started
    eng.add_request("run", [1, 2], SamplingParams(max_tokens=50), arrival_time=98.0)
    eng.add_request("queued", [1, 2], SamplingParams(max_tokens=1), arrival_time=99.0)
    eng.update(b := eng.schedule(), eng.executor.execute(b))
    wall = 1_800_000_000.0
    status = eng.get_status(timestamp=wall)
    assert [w.request_id for w in status.waiting] == ["queued"]
    assert status.waiting[0].arrival_time == pytest.approx(wall - 1.0)
    assert status.running[0].arrival_time == pytest.approx(wall - 2.0)
    assert eng.get_status().waiting[0].arrival_time == 99.0  # no timestamp given: the engine's clock
    load = SLOPredictor(SLOConfig(classes={"p0": {"ttft_s": 10.0, "tpot_s": 0.3, "priority": "normal"}},
                                   default_class="p0")).load(status)
    assert load.queued == ((int(Priority.NORMAL), 2),) and load.overdue == ()  # waited 1 s of its 10
