"""The slo dispatch policy and rescue by migration, on literal snapshots."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llumnix.core.request import Priority
from llumnix.core.status import RequestBrief
from llumnix.policy import DispatchRequest, GlobalScheduler, PolicyConfigError, SchedulingConfig
from llumnix.policy.slo import SLOConfig
from llumnix.policy.slo_dispatch import MEETS, RequestShedError, SLODispatch, candidate_score, should_shed
from llumnix.policy.slo_predict import SLOPredictor
from llumnix.policy.slo_rescue import rescue_orders, tpot_rescues, ttft_rescues
from tests.policy.snapshots import inst, run, wait

HIGH, NORMAL = int(Priority.HIGH), int(Priority.NORMAL)


def _gs(rescue: bool = True, **resched) -> GlobalScheduler:
    return GlobalScheduler(SchedulingConfig.from_dict({
        "dispatch": {"policy": "slo"}, "slo": {"rescue": rescue},
        "rescheduling": {"out_threshold": -1e9, "in_threshold": -1e9, **resched}}))  # no freeness pairs


def _busy(iid: str, n: int, prio: int, tokens: int, total: int = 4000, waiting=()) -> object:
    return inst(iid, total=total, running=[run(f"{iid}-r{i}", -(-tokens // 16), tokens, prio) for i in range(n)],
                waiting=waiting)


def test_interactive_request_goes_where_its_ttft_holds() -> None:
    # a: few running, but ten 2,000-token prompts queued ahead (~2 s of prefill);
    # b: more running, nothing queued
    a = _busy("a", 4, NORMAL, 300, waiting=[wait(f"q{i}", 2000, HIGH) for i in range(10)])
    b = _busy("b", 20, NORMAL, 300)
    gs = _gs()
    for s in (a, b):
        gs.add_instance(s)
    assert gs.dispatch(DispatchRequest("x", 200, HIGH), 0.0) == "b"
    pred = gs.slo
    assert pred is not None and pred.ttft(pred.load(a), 200, HIGH) > 1.0 > pred.ttft(pred.load(b), 200, HIGH)


def test_batch_request_does_not_push_interactive_requests_past_tpot() -> None:
    # a runs interactive requests at a TPOT just under 0.1 s; one more long request breaks it
    a = _busy("a", 40, HIGH, 740, total=8000)
    b = replace(_busy("b", 70, NORMAL, 1600, total=8000), max_num_seqs=128)  # 70 run: a cap above it
    pred = SLOPredictor(SLOConfig())
    la, lb = pred.load(a), pred.load(b)
    assert pred.tpot_now(la, 0.0) < 0.1 < pred.tpot(la, 1600, 0.0)  # the join breaks a's requests
    assert pred.tpot(lb, 1600, 0.0) < 0.3 and pred.ttft(la, 1600, NORMAL) < pred.ttft(lb, 1600, NORMAL)
    gs = _gs()
    for s in (a, b):
        gs.add_instance(s)
    assert gs.dispatch(DispatchRequest("x", 1600, NORMAL), 0.0) == "b"


def test_when_none_meets_the_least_bad_is_chosen() -> None:
    # both queues are far past 1 s of prefill work; b's is shorter
    a = _busy("a", 2, NORMAL, 100, waiting=[wait(f"a{i}", 3000, HIGH) for i in range(12)])
    b = _busy("b", 2, NORMAL, 100, waiting=[wait(f"b{i}", 3000, HIGH) for i in range(6)])
    pred = SLOPredictor(SLOConfig())
    req = SLODispatch(pred, SLOConfig().get("interactive"), HIGH, 500)
    sa, sb = candidate_score(a, req, 0.0), candidate_score(b, req, 0.0)
    assert sa < sb < MEETS
    gs = _gs()
    for s in (a, b):
        gs.add_instance(s)
    assert gs.dispatch(DispatchRequest("x", 500, HIGH), 0.0) == "b"


def test_named_class_wins_over_priority_and_unknown_class_is_refused() -> None:
    gs = _gs()
    gs.add_instance(_busy("a", 1, NORMAL, 100))
    assert gs.dispatch(DispatchRequest("x", 100, NORMAL, slo_class="interactive"), 0.0) == "a"
    assert gs._ctx.slo is not None and gs._ctx.slo.slo_class.name == "interactive"
    with pytest.raises(PolicyConfigError, match="slo_class"):
        gs.dispatch(DispatchRequest("y", 100, NORMAL, slo_class="gold"), 0.0)


def test_other_policies_carry_no_predictor() -> None:
    assert GlobalScheduler(SchedulingConfig()).slo is None


def test_should_shed_keeps_to_the_share() -> None:
    batch = SLOConfig(classes={"batch": {"ttft_s": 10, "tpot_s": 0.3, "shed_share": 0.1}}).get("batch")
    assert not should_shed(MEETS, batch, 0, 100)  # an instance meets it: never shed
    assert should_shed(0.2, batch, 0, 100)
    assert not should_shed(0.2, batch, 10, 100)  # 11 of 101 would pass the 10%
    assert not should_shed(0.2, SLOConfig().get("batch"), 0, 100)  # no shed share: queue


def test_ttft_rescue_moves_the_queued_request_that_would_miss() -> None:
    # q0 has waited 0.5 s of its 1 s behind 1.5 s of prefill work on a; b is nearly idle.
    # p0 and p1 would miss too, but their own 0.75 s prefill misses anywhere: they stay
    a = _busy("a", 2, NORMAL, 100, waiting=[wait("p0", 3000, HIGH, 0.4), wait("p1", 3000, HIGH, 0.4),
                                            wait("q0", 200, HIGH, 0.5)])
    b = _busy("b", 1, NORMAL, 100)
    pred = SLOPredictor(SLOConfig())
    busy: set[str] = set()
    orders = ttft_rescues([a, b], pred, 1.0, SchedulingConfig().rescheduling, busy)
    assert [(o.src_instance_id, o.dst_instance_id, o.request_id) for o in orders] == [("a", "b", "q0")]
    assert busy == {"a", "b"}
    # past its objective already: too late, nothing moves
    assert ttft_rescues([a, b], pred, 5.0, SchedulingConfig().rescheduling, set()) == []


def test_tpot_rescue_moves_work_off_an_instance_past_its_objective() -> None:
    # a: interactive requests and batch ones, predicted TPOT past 0.1 s; b: light, meets after the move
    a = inst("a", total=8000, running=[run(f"i{i}", 100, 1600, HIGH) for i in range(30)]
             + [run(f"n{i}", 100, 1600, NORMAL) for i in range(30)])
    b = _busy("b", 2, NORMAL, 100)
    pred = SLOPredictor(SLOConfig())
    assert pred.tpot_now(pred.load(a), 0.0) > 0.1
    orders = tpot_rescues([a, b], pred, 0.0, SchedulingConfig().rescheduling)
    # the order names the request it chose: a batch one (the lowest priority), not an interactive one
    assert [(o.src_instance_id, o.dst_instance_id, o.request_id) for o in orders] == [("a", "b", "n0")]


def test_rescue_is_an_ablation_switch_in_reschedule() -> None:
    a = _busy("a", 2, NORMAL, 100, waiting=[wait("p0", 3000, HIGH, 0.0), wait("q", 200, HIGH, 0.0)])
    b = _busy("b", 1, NORMAL, 100)
    on, off = _gs(), _gs(rescue=False)
    for gs in (on, off):
        for s in (a, b):
            gs.add_instance(s)
    assert [o.request_id for o in on.reschedule(0.5)] == ["q"]
    assert off.reschedule(0.5) == []
    assert rescue_orders([a, b], SLOPredictor(SLOConfig()), 0.5, SchedulingConfig().rescheduling,
                         taken={"a"}) == []  # a freeness order holds a: no rescue touches it


def test_a_class_that_may_shed_is_refused_when_none_meets_and_only_up_to_its_share() -> None:
    gs = GlobalScheduler(SchedulingConfig.from_dict({
        "dispatch": {"policy": "slo"},
        "slo": {"classes": {"interactive": {"ttft_s": 1, "tpot_s": 0.1, "priority": "high", "shed_share": 0.5},
                            "batch": {"ttft_s": 10, "tpot_s": 0.3}}}}))
    gs.add_instance(_busy("a", 2, NORMAL, 100, waiting=[wait(f"q{i}", 3000, HIGH) for i in range(8)]))
    assert gs.dispatch(DispatchRequest("x0", 500, HIGH), 0.0) == "a"  # 1 of 1 would pass the 50% share: queued
    with pytest.raises(RequestShedError) as e:
        gs.dispatch(DispatchRequest("x1", 500, HIGH), 0.0)
    assert e.value.slo_class == "interactive" and e.value.retry_after_s >= 1 and "slo_class" in str(e.value)
    assert gs.dispatch(DispatchRequest("x2", 500, HIGH), 0.0) == "a"  # 2 of 3 would pass it
    assert gs.dispatch(DispatchRequest("y", 500, NORMAL), 0.0) == "a"  # batch has no shed share
    assert gs.shed.num_shed == {"interactive": 1} and gs.shed.num_seen == {"interactive": 3, "batch": 1}


def test_rank_freeness_orders_the_candidates_that_meet_by_freeness() -> None:
    # both meet a batch request; a has more free blocks per running request, b the smaller decode batch
    a = inst("a", total=4000, running=[run(f"a{i}", 10, 160) for i in range(20)])
    b = inst("b", total=1000, running=[run(f"b{i}", 10, 160) for i in range(10)])
    for rank, want in (("slack", "b"), ("freeness", "a")):
        gs = GlobalScheduler(SchedulingConfig.from_dict({"dispatch": {"policy": "slo", "params": {"rank": rank}}}))
        for s in (a, b):
            gs.add_instance(s)
        assert gs.dispatch(DispatchRequest("x", 100, NORMAL), 0.0) == want
    with pytest.raises(PolicyConfigError, match="dispatch.params.rank"):
        SchedulingConfig.from_dict({"dispatch": {"policy": "slo", "params": {"rank": "speed"}}})


def test_a_queue_memory_holds_back_does_not_put_the_running_requests_past_their_tpot() -> None:
    # 30 interactive requests decode on pace; 20 long prompts wait for memory that is not there
    queue = [wait(f"q{i}", 1600, HIGH) for i in range(20)]
    running = [run(f"i{i}", 47, 740, HIGH) for i in range(30)]
    full = inst("a", total=1500, running=running, waiting=queue)
    alone = inst("a", total=1500, running=running)
    roomy = inst("a", total=8000, running=running, waiting=queue)  # there the queue joins the batch
    pred = SLOPredictor(SLOConfig())
    on_pace = pred.tpot_now(pred.load(alone), 0.0)
    assert on_pace < 0.1 and pred.tpot_now(pred.load(full), 0.0) == pytest.approx(on_pace)
    assert pred.tpot_now(pred.load(roomy), 0.0) > 0.1
    b = _busy("b", 1, NORMAL, 100)
    assert tpot_rescues([full, b], pred, 0.0, SchedulingConfig().rescheduling) == []  # on pace: nothing moves
    assert [o.src_instance_id for o in tpot_rescues([roomy, b], pred, 0.0, SchedulingConfig().rescheduling)] == ["a"]


def test_a_request_beyond_the_batch_cap_waits_for_a_running_one_to_end() -> None:
    """Memory is plenty on both; ``full`` runs its engine's 64 sequences (the snapshots'
    ``max_num_seqs``), so a newcomer's first token waits for the soonest to end, as it
    waits for blocks (``room`` has a place: no wait)."""
    pred = SLOPredictor(SLOConfig())
    full, room = _busy("a", 64, NORMAL, 100, total=8000), _busy("b", 63, NORMAL, 100, total=8000)
    lf, lr = pred.load(full), pred.load(room)
    assert lf.max_num_seqs == 64 and lf.num_free_blocks > 1000
    prefill = lf.steps.prefill_s((200,))
    step_f = lf.steps.decode_s(64, lf.num_context_tokens)
    step_r = lr.steps.decode_s(63, lr.num_context_tokens)
    assert pred.ttft(lf, 200, NORMAL) == pytest.approx(step_f / 2 + lf.release[0][0] * step_f + prefill)
    assert pred.ttft(lr, 200, NORMAL) == pytest.approx(step_r / 2 + prefill)


def test_the_expected_ttft_counts_the_deadline_preemption_for_blocks_but_dispatch_does_not() -> None:
    """Memory is full of batch requests: an interactive newcomer may preempt them for its
    blocks at once (``engine/objectives.py``), so the TTFT to expect (``objective_s``) has no
    wait for memory; a batch newcomer may preempt none of them (all due before it) and waits
    for the soonest to end either way. Dispatch scores the wait without preemption: it places
    a request where it takes nothing from anyone. An engine that does not preempt for
    deadlines (prefix caching) is expected to make the interactive request wait too."""
    pred = SLOPredictor(SLOConfig())
    full = replace(_busy("a", 20, NORMAL, 400, total=505), preempts_for_deadlines=True)
    load = pred.load(full)
    assert load.num_free_blocks < 13 and load.num_running < load.max_num_seqs  # 200 tokens need 13 blocks
    step = load.steps.decode_s(20, load.num_context_tokens)
    memory_wait = load.release[0][0] * step
    hi, lo = SLOConfig().class_of("interactive", HIGH), SLOConfig().class_of("batch", NORMAL)
    prefill = load.steps.prefill_s((200,))
    assert pred.ttft(load, 200, HIGH, hi.ttft_s, objective_s=hi.ttft_s) == pytest.approx(step / 2 + prefill)
    assert pred.ttft(load, 200, HIGH, hi.ttft_s) == pytest.approx(step / 2 + memory_wait + prefill)
    assert pred.ttft(load, 200, NORMAL, lo.ttft_s, objective_s=lo.ttft_s) == pytest.approx(
        step / 2 + memory_wait + prefill)
    # preempting, it would meet its 1 s; taking nothing, it would not: dispatch says it misses
    assert step / 2 + prefill < hi.ttft_s < step / 2 + memory_wait + prefill
    assert candidate_score(full, SLODispatch(pred, hi, HIGH, 200), 0.0) < MEETS
    caching = SLOPredictor(SLOConfig()).load(replace(full, preempts_for_deadlines=False))
    assert pred.ttft(caching, 200, HIGH, hi.ttft_s, objective_s=hi.ttft_s) == pytest.approx(
        step / 2 + memory_wait + prefill)


def test_a_full_batch_is_no_wait_for_a_first_token_that_may_preempt_for_a_place() -> None:
    """The engine preempts for a place in a full batch as for blocks (``engine/
    deadline_preemption.py``): an interactive newcomer behind 64 running batch requests (the
    cap) expects no wait; a batch newcomer, which may preempt none of them, waits for the
    soonest to end."""
    pred = SLOPredictor(SLOConfig())
    full = replace(_busy("a", 64, NORMAL, 100, total=8000), preempts_for_deadlines=True)
    load = pred.load(full)
    assert load.max_num_seqs == 64 and load.num_free_blocks > 1000
    step = load.steps.decode_s(64, load.num_context_tokens)
    hi, lo = SLOConfig().class_of("interactive", HIGH), SLOConfig().class_of("batch", NORMAL)
    prefill = load.steps.prefill_s((200,))
    assert pred.ttft(load, 200, HIGH, hi.ttft_s, objective_s=hi.ttft_s) == pytest.approx(step / 2 + prefill)
    assert pred.ttft(load, 200, NORMAL, lo.ttft_s, objective_s=lo.ttft_s) == pytest.approx(
        step / 2 + load.release[0][0] * step + prefill)


def test_requests_with_tokens_banked_are_due_by_their_tpot_not_ahead_of_a_first_token() -> None:
    """Queued requests preempted back with 200 tokens made are due at arrival + 0.3 s x 200
    (the engine's deadline, ``engine/objectives.py``), after a batch newcomer's first token
    (due now + 10 s): the TTFT to expect (``objective_s``) does not wait for their prefills
    or their blocks. The same prompts queued for their first tokens (due at arrival + 10 s)
    are ahead of it. Dispatch counts the banked ones ahead too: it does not place a request
    where it would push them back."""
    pred = SLOPredictor(SLOConfig())
    running = [run(f"r{i}", 10, 160, NORMAL) for i in range(20)]

    def queued(made: int) -> list[RequestBrief]:
        return [RequestBrief(f"q{i}", NORMAL, 0, 2000 + made, 0.0, False, num_output_tokens=made) for i in range(5)]

    banked = pred.load(inst("a", total=300, running=running, waiting=queued(200), ts=5.0))
    fresh = pred.load(inst("b", total=300, running=running, waiting=queued(0), ts=5.0))
    assert banked.queued_due == (60.0,) * 5 and fresh.queued_due == (10.0,) * 5
    assert banked.queued_banked == (True,) * 5 and fresh.queued_banked == (False,) * 5
    step = banked.steps.decode_s(20, banked.num_context_tokens)
    alone = step / 2 + banked.steps.prefill_s((200,))
    assert pred.ttft(banked, 200, NORMAL, 15.0, objective_s=10.0) == pytest.approx(alone)
    assert pred.ttft(fresh, 200, NORMAL, 15.0, objective_s=10.0) > alone + 5 * fresh.steps.prefill_s((2000,))
    assert pred.ttft(banked, 200, NORMAL, 15.0) > alone + 5 * banked.steps.prefill_s((2200,))  # dispatch


def test_running_requests_with_tokens_banked_may_be_preempted_for_an_urgent_first_token() -> None:
    """Memory full of batch requests 100 tokens in (due at 0.3 s x 100 = 30 s): a batch
    newcomer due at 11 s may take their blocks once urgent (half its 10 s objective), so the
    TTFT to expect waits 5 s at most, not the ~8 s until the soonest is expected to end (what
    dispatch still scores). Counted due at arrival + 10 s, as before, they were due before
    it and the bound never applied."""
    pred = SLOPredictor(SLOConfig())
    running = [RequestBrief(f"r{i}", NORMAL, 25, 400, 0.0, True, num_output_tokens=100) for i in range(20)]
    full = replace(inst("a", total=505, running=running, ts=1.0), preempts_for_deadlines=True)
    load = pred.load(full)
    assert load.runners[0] == (NORMAL, 30.0, 25) and load.num_free_blocks < 13  # 200 tokens need 13 blocks
    step = load.steps.decode_s(20, load.num_context_tokens)
    prefill = load.steps.prefill_s((200,))
    memory_wait = load.release[0][0] * step
    assert memory_wait > 5.0
    assert pred.ttft(load, 200, NORMAL, 11.0, objective_s=10.0) == pytest.approx(step / 2 + 5.0 + prefill)
    assert pred.ttft(load, 200, NORMAL, 11.0) == pytest.approx(step / 2 + memory_wait + prefill)


def test_queued_requests_that_fit_share_the_newcomers_prefill_step() -> None:
    """Three batch prompts queued behind an interactive newcomer (lower priority) fit in
    memory: an engine without chunked prefill admits them in the newcomer's prefill step, so
    the first token to expect (``objective_s``) waits for their prefills too; dispatch scores
    its own prompt's step. Where memory holds only the newcomer, they stay queued."""
    pred = SLOPredictor(SLOConfig())
    running = [run(f"r{i}", 10, 160, NORMAL) for i in range(4)]
    queue = [wait(f"q{i}", 1000, NORMAL) for i in range(3)]
    roomy = pred.load(inst("a", total=4000, running=running, waiting=queue))
    tight = pred.load(inst("b", total=84, running=running, waiting=queue))  # 43 free: 13 for it, 63 a prompt
    step = roomy.steps.decode_s(4, roomy.num_context_tokens)
    shared = step / 2 + roomy.steps.prefill_s((200, 1000, 1000, 1000))
    alone = step / 2 + roomy.steps.prefill_s((200,))
    assert pred.ttft(roomy, 200, HIGH, 1.0, objective_s=1.0) == pytest.approx(shared)
    assert pred.ttft(roomy, 200, HIGH, 1.0) == pytest.approx(alone)
    assert pred.ttft(tight, 200, HIGH, 1.0, objective_s=1.0) == pytest.approx(alone)


def test_a_shed_decision_reads_the_expected_tpot_not_the_whole_queues() -> None:
    """40 interactive requests run just under their 0.1 s TPOT; ten batch prompts queue
    behind, which memory holds back. Dispatch scores the TPOT with the whole queue in the
    batch (it joins in time: a miss there); a shed decision asks whether the newcomer would
    miss, with the batch that memory admits (it would not), so it is queued, not refused.
    Shedding by the whole queue's TPOT refused batch requests that all would have met
    (benchmarks/slo/shed_would_meet.json)."""
    cfg = SchedulingConfig.from_dict({
        "dispatch": {"policy": "slo"},
        "slo": {"classes": {"interactive": {"ttft_s": 1, "tpot_s": 0.1, "priority": "high", "shed_share": 1.0},
                            "batch": {"ttft_s": 10, "tpot_s": 0.3}}}})
    a = _busy("a", 40, HIGH, 700, total=1900, waiting=[wait(f"q{i}", 2000, NORMAL) for i in range(10)])
    gs = GlobalScheduler(cfg)
    gs.add_instance(a)
    assert gs.slo is not None
    load, req = gs.slo.load(a), SLODispatch(gs.slo, cfg.slo.get("interactive"), HIGH, 100)
    assert gs.slo.tpot(load, 100, 0.0, expected=True) < 0.1 < gs.slo.tpot(load, 100, 0.0)
    assert candidate_score(a, req, 0.0) < MEETS <= candidate_score(a, req, 0.0, expected=True)
    assert gs.dispatch(DispatchRequest("x", 100, HIGH), 0.0) == "a"
    assert gs.shed.num_shed == {}
