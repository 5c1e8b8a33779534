"""PD hand-offs without Ray: ``HandoffWorker`` on a real prefill InstanceServer moves each
request to a decode InstanceServer after its first token, through the real live migration
over TCP; ``PDBook`` picks destinations and counts. Every token exactly once, and the
block accounting exact on both sides, committed or aborted."""
from __future__ import annotations

import dataclasses
import logging
import re
import time

import pytest

from llumnix.cluster.handoff import HandoffWorker
from llumnix.cluster.pd import PDBook
from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.driver import migrate
from llumnix.policy import FreenessConfig
from llumnix.policy.pd import PDConfig, RoleChange
from tests.migration.test_live_migration import PROMPT, Pair, reference
from tests.policy.snapshots import inst, run


def _worker(pair: Pair, room: list[bool], reports: list[dict]) -> HandoffWorker:
    def ask(request_id: str, num_blocks: int):
        return ("dst", None) if room[0] else None

    def mig(request_id: str, dst_id: str, dst, overrides):
        return dataclasses.asdict(migrate(request_id, pair.src, pair.endpoint, pair.sender,
                                          MigrationConfig(**{"max_stages": 3, **(overrides or {})})))

    w = HandoffWorker(pair.src, ask, mig, reports.append, retry_s=0.05)
    pair.src.on_step = w.on_step
    w.set_role("prefill")
    w.start()
    return w


def _collect_all(pair: Pair, rids: list[str], timeout: float = 30.0) -> dict[str, list[int]]:
    """Every request's tokens from both instances, in order, once all have finished."""
    done: set[str] = set()
    deadline = time.time() + timeout
    while done != set(rids) and time.time() < deadline:
        for srv in pair.servers:
            for o in srv.get_outputs(0.01):
                pair.tokens.setdefault(o.request_id, []).append((o.num_output_tokens, o.new_token_ids[0]))
                if o.is_finished:
                    done.add(o.request_id)
    assert done == set(rids), f"unfinished: {set(rids) - done}"
    return {rid: [t for _, t in sorted(pair.tokens[rid])] for rid in rids}


def _where(pair: Pair, rid: str) -> list[str]:
    return [s.instance_id for s in pair.servers if s.call(lambda s=s: rid in s.engine.requests)]


@pytest.mark.slow  # seconds of decoding, so hand-offs one at a time overlap the requests
def test_requests_move_to_the_decode_instance_after_their_first_token_tokens_once(caplog):
    caplog.set_level(logging.INFO, logger="llumnix.cluster.handoff")
    params = SamplingParams(max_tokens=150)  # 1.5 s each: hand-offs one at a time finish first under load
    reports: list[dict] = []
    with Pair(num_blocks=256, dst_blocks=256) as pair:
        w = _worker(pair, [True], reports)
        try:
            for i in range(3):
                pair.add(f"x{i}", PROMPT[i:], params)
            outs = _collect_all(pair, ["x0", "x1", "x2"])
        finally:
            w.stop()
        # hand-offs go one at a time and a loaded machine stretches each (0.1-0.9 s seen):
        # a request may finish before its turn (tests/cluster/test_pd_cluster.py requires all)
        assert any(r["committed"] for r in reports), reports
        assert all(r["committed"] or r["abort_code"] == "source_finished" for r in reports), reports
        lines = [r.getMessage() for r in caplog.records if r.name == "llumnix.cluster.handoff"]
        assert len(lines) == sum(r["committed"] for r in reports)  # one line each; none for a request that ended first
        assert all(re.fullmatch(r"PD hand-off of x\d \S+ -> dst committed: \d+ blocks .*, downtime [\d.]+ ms", line)
                   for line in lines), lines
        for i in range(3):
            rid = f"x{i}"
            assert sorted(k for k, _ in pair.tokens[rid]) == list(range(1, 151))  # each token once
            assert outs[rid] == reference(PROMPT[i:], params)
        pair.check_drained()


@pytest.mark.slow
def test_a_full_decode_pool_keeps_the_request_decoding_here_until_room_appears():
    params = SamplingParams(max_tokens=200)
    room, reports = [False], []
    with Pair(num_blocks=128, dst_blocks=128, slow_s=0.02) as pair:  # 4 s of decoding
        w = _worker(pair, room, reports)
        try:
            pair.add("x", PROMPT, params)
            time.sleep(0.2)
            assert _where(pair, "x") == ["src"] and not reports  # offered, refused, still decoding
            room[0] = True
            out = pair.collect("x")
        finally:
            w.stop()
        assert [r["committed"] for r in reports] == [True]
        assert out == reference(PROMPT, params)
        pair.check_drained()


def test_a_prompt_in_chunks_is_handed_off_chunk_by_chunk_and_only_its_tail_after_the_first_token():
    """Chunked prefill at 8 tokens a step: the worker starts the hand-off at the prompt's
    first full block, its chunks go while the next compute, and the pause after the first
    token copies the tail; the client's stream has every token once."""
    prompt = [(7 * i) % 900 + 1 for i in range(128)]  # 32 blocks, 16 chunks: 0.8 s, so a loaded
    params = SamplingParams(max_tokens=60)  # machine's slow first stage still ends before the last chunk
    reports: list[dict] = []
    with Pair(chunk_tokens=8, slow_s=0.05) as pair:
        w = _worker(pair, [True], reports)
        try:
            pair.add("x", prompt, params)
            out = pair.collect("x")
        finally:
            w.stop()
        assert [r["committed"] for r in reports] == [True], reports
        assert reports[0]["num_prefill_stages"] >= 1 and reports[0]["num_last_stage_blocks"] < 16, reports
        assert sorted(k for k, _ in pair.tokens["x"]) == list(range(1, 61))
        assert out == reference(prompt, params)
        pair.check_drained()


def test_a_prompts_first_chunk_wakes_the_worker_with_no_glance_to_fall_back_on(monkeypatch):
    """The step thread's hook wakes the worker at a step of prompt work (a chunk samples
    nothing, so no output tells): the prompt is followed while it prefills."""
    monkeypatch.setattr(HandoffWorker, "GLANCE_S", 60.0)  # only the hook can wake it in time
    prompt = [(5 * i) % 900 + 1 for i in range(128)]
    reports: list[dict] = []
    with Pair(chunk_tokens=8, slow_s=0.05) as pair:
        w = _worker(pair, [True], reports)
        try:
            time.sleep(0.1)  # its first round (started by set_role) found nothing
            pair.add("x", prompt, SamplingParams(max_tokens=20))
            out = pair.collect("x")
        finally:
            w.stop()
        assert [r["committed"] for r in reports] == [True], reports
        assert reports[0]["num_prefill_stages"] >= 1, reports  # followed from its chunks
        assert out == reference(prompt, SamplingParams(max_tokens=20))
        pair.check_drained()


def test_a_refused_reservation_aborts_with_both_pools_exact():
    """The decode instance has fewer blocks than the request: the hand-off aborts, the
    request finishes on the prefill instance, and nothing leaks on either side."""
    params = SamplingParams(max_tokens=100)  # 1 s: long enough to be offered under load
    reports: list[dict] = []
    with Pair(dst_blocks=4) as pair:
        w = _worker(pair, [True], reports)
        try:
            pair.add("x", PROMPT, params)
            out = pair.collect("x")
        finally:
            w.stop()
        assert reports and not any(r["committed"] for r in reports)
        assert out == reference(PROMPT, params)
        pair.check_drained()


def test_a_client_abort_mid_handoff_leaves_both_pools_exact():
    params = SamplingParams(max_tokens=200)
    reports: list[dict] = []
    with Pair() as pair:
        w = _worker(pair, [True], reports)
        try:
            pair.add("x", PROMPT, params)
            deadline = time.time() + 5
            while not pair.src.call(lambda: "x" in pair.src.llumlet.migrating_out) and time.time() < deadline:
                time.sleep(0.002)
            for srv in pair.servers:  # the gateway aborts wherever the request is
                srv.call(lambda srv=srv: srv.engine.abort_request("x"))
            time.sleep(0.5)
            for srv in pair.servers:
                srv.call(lambda srv=srv: srv.engine.abort_request("x"))
        finally:
            w.stop()
        deadline = time.time() + 5
        while time.time() < deadline and any(s.call(lambda s=s: s.engine.kv.num_used_blocks) for s in pair.servers):
            time.sleep(0.05)
        assert len(reports) >= 1
        pair.check_drained()


def test_the_book_promises_blocks_until_the_destination_reports_and_counts():
    cfg = PDConfig(mode="static", prefill_instances=1)
    book = PDBook(cfg, FreenessConfig(headroom_tokens={}))
    assert [book.add(i, 0.0) for i in ("p", "d1", "d2")] == ["prefill", "decode", "decode"]
    statuses = [inst("p"), inst("d1", running=[run("a", 40)]), inst("d2", running=[run("b", 50)])]
    assert book.pick(statuses, "p", 30) == "d1"  # the freer decode instance
    assert book.pick(statuses, "p", 30) == "d2"  # d1's 58 free blocks are promised 31
    assert book.pick(statuses, "p", 30) is None  # neither has room left: the request waits
    book.on_status("d1")  # d1's report counts its reservation: room again
    assert book.pick(statuses, "p", 30) == "d1"
    book.on_handoff({"committed": True, "downtime": 0.01})
    book.on_handoff({"committed": False, "abort_reason": "destination refused to reserve blocks"})
    info = book.info()
    assert (info["handoffs_done"], info["handoffs_failed"], info["handoffs_waiting"]) == (1, 1, 1)
    assert info["roles"] == {"d1": "decode", "d2": "decode", "p": "prefill"}
    book.apply(RoleChange("d1", "mixed", "lend"), 5.0)
    assert book.role_of("d1") == "mixed" and book.info()["lends"] == 1
    # a restarted LlumSched learns each role from the instance's push, not the start rule
    again = PDBook(cfg, FreenessConfig())
    assert again.add("d1", 0.0, "decode") == "decode" and again.add("p", 0.0) == "prefill"


def test_adaptive_rounds_lend_reclaim_and_flip_a_prefill_instance_when_hand_offs_wait():
    from llumnix.core.status import RequestBrief

    cfg = PDConfig(mode="adaptive", prefill_instances=1, min_decode=1, lend_above_tokens=1000,
                   reclaim_below_tokens=200, decode_room_freeness=5, decode_tight_freeness=1, cooldown_s=1)
    book = PDBook(cfg, FreenessConfig(headroom_tokens={}))
    for i in ("p", "d1", "d2"):
        book.add(i, 0.0)
    queued = [RequestBrief(f"q{i}", 0, 0, 800, 0.0, False) for i in range(3)]
    statuses = {"p": inst("p", waiting=queued), "d1": inst("d1", running=[run("a", 30)]), "d2": inst("d2")}
    [change] = book.decide_all(statuses, 10.0)
    assert change == RoleChange("d2", "mixed", "lend")  # 2,400 queued tokens; d2 is the freest
    book.apply(change, 10.0)
    assert book.decide_all(statuses, 10.5) == []  # cooldown
    # the queue is gone: the lent instance goes back to decoding
    statuses = {"p": inst("p"), "d1": inst("d1"), "d2": inst("d2")}
    assert book.decide_all(statuses, 12.0) == [RoleChange("d2", "decode", "reclaim")]
    # two prefill instances, a request past its first token waiting on p1 (the decode pool
    # is full for it), no prompt queued: a prefill instance becomes a decode one (the least
    # queued, ties by id: p1, whose waiting request then simply decodes there)
    book2 = PDBook(dataclasses.replace(cfg, prefill_instances=2), FreenessConfig(headroom_tokens={}))
    for i in ("p1", "p2", "d1"):
        book2.add(i, 0.0)
    decoding = RequestBrief("x", 0, 20, 320, 0.0, True, num_output_tokens=5)
    statuses = {"p1": inst("p1", running=[decoding]), "p2": inst("p2"), "d1": inst("d1", running=[run("a", 95)])}
    assert book2.decide_all(statuses, 30.0) == [RoleChange("p1", "decode", "flip")]
    # static PD never changes a role
    static = PDBook(PDConfig(mode="static"), FreenessConfig())
    static.add("p", 0.0)
    assert static.decide_all(statuses, 20.0) == []


def test_under_a_burst_the_clusters_book_lends_several_decode_instances_in_one_round():
    """``max_lends_per_round``: LlumSched's round applies every lend the policy gives, as
    the simulator does (4,800 queued tokens, 1,000 a taker: 4 more takers, 3 allowed)."""
    from llumnix.core.status import RequestBrief

    cfg = PDConfig(mode="adaptive", prefill_instances=1, min_decode=1, lend_above_tokens=1000,
                   reclaim_below_tokens=200, decode_room_freeness=5, cooldown_s=1, max_lends_per_round=3)
    book = PDBook(cfg, FreenessConfig(headroom_tokens={}))
    ids = ("p", "d1", "d2", "d3", "d4", "d5")
    for i in ids:
        book.add(i, 0.0)
    queued = [RequestBrief(f"q{i}", 0, 0, 800, 0.0, False) for i in range(6)]
    statuses = {i: inst(i, waiting=queued if i == "p" else []) for i in ids}
    changes = book.decide_all(statuses, 10.0)
    assert [c.reason for c in changes] == ["lend"] * 3 and len({c.instance_id for c in changes}) == 3
    for c in changes:
        book.apply(c, 10.0)
    assert book.info()["lends"] == 3 and book.decide_all(statuses, 10.5) == []  # one cooldown for the round


def test_an_instance_reporting_another_role_than_the_books_is_told_again_after_a_grace():
    book = PDBook(PDConfig(mode="adaptive", prefill_instances=1), FreenessConfig())
    book.add("p", 0.0)
    book.add("d", 0.0)
    assert book.reconcile("d", "decode", 5.0) is None  # agrees
    book.apply(RoleChange("d", "mixed", "lend"), 10.0)
    assert book.reconcile("d", "decode", 10.3) is None  # a push sent before it heard the change
    assert book.reconcile("d", "decode", 11.5) == "mixed"  # its set_role was lost: told again
    assert book.reconcile("d", None, 11.5) is None and book.reconcile("x", "decode", 11.5) is None
    assert book.info()["role_resends"] == 1
    assert PDBook(PDConfig(mode="off"), FreenessConfig()).reconcile("d", "prefill", 9.0) is None
