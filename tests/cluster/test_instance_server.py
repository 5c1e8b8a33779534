"""InstanceServer without Ray: commands at step boundaries, outputs, failure surfacing."""
from __future__ import annotations

import threading
import time

import pytest

from llumnix.cluster.instance import InstanceServer
from llumnix.core.sampling_params import SamplingParams
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from tests.engine.helpers import make_engine


def _server(**kw):
    eng = make_engine(**kw)
    eng.clock = __import__("llumnix.core.clock", fromlist=["WallClock"]).WallClock()
    statuses = []
    srv = InstanceServer(eng, Llumlet(eng.instance_id, eng, ReschedulingConfig(), FreenessConfig()),
                         on_status=statuses.append, status_interval_s=0.01)
    srv.start()
    return srv, statuses


def _collect(srv, n_finished, timeout=10.0):
    got, done = {}, 0
    deadline = time.time() + timeout
    while done < n_finished and time.time() < deadline:
        for o in srv.get_outputs(0.1):
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
            done += o.is_finished
    return got


def test_requests_stream_out_and_blocks_return():
    srv, statuses = _server()
    try:
        for i in range(3):
            srv.call(lambda i=i: srv.engine.add_request(f"r{i}", [1, 2, 3 + i], SamplingParams(max_tokens=6)))
        got = _collect(srv, 3)
        assert {k: len(v) for k, v in got.items()} == {"r0": 6, "r1": 6, "r2": 6}
        assert srv.call(lambda: srv.engine.kv.num_free_blocks) == 64
        assert statuses and statuses[-1].instance_id == "i0"  # pushed on load change
    finally:
        srv.stop()


def test_a_step_that_fails_on_a_request_ends_that_request_and_the_loop_goes_on():
    srv, _ = _server()
    real = srv.engine.executor.execute

    def poisoned(batch):
        if any(r.request_id == "bad" for r in batch.scheduled):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(batch)

    srv.engine.executor.execute = poisoned
    try:
        for rid in ("bad", "good"):
            srv.call(lambda rid=rid: srv.engine.add_request(rid, [1, 2], SamplingParams(max_tokens=3)))
        done: dict[str, str] = {}
        deadline = time.time() + 10
        while len(done) < 2 and time.time() < deadline:
            for o in srv.get_outputs(0.2):
                if o.finish_reason:
                    done[o.request_id] = o.finish_reason
        assert done == {"bad": "error", "good": "length"} and srv.is_alive
    finally:
        srv.stop()


def test_a_dead_step_thread_is_reported_not_waited_on():
    srv, _ = _server()

    def boom():
        raise RuntimeError("scheduler crashed")  # a bug outside the model step: the loop ends

    srv.engine.schedule = boom
    srv.call(lambda: srv.engine.add_request("r", [1, 2], SamplingParams(max_tokens=3)))
    deadline = time.time() + 5
    while srv.is_alive and time.time() < deadline:
        time.sleep(0.01)
    assert not srv.is_alive
    with pytest.raises(RuntimeError, match="stopped"):
        srv.get_outputs(0.1)
    with pytest.raises(RuntimeError, match="not running"):
        srv.call(lambda: None)


def test_each_client_reads_only_its_own_outputs():
    """Two gateways on one instance: outputs go to the outbox of the request's client."""
    srv, _ = _server()
    try:
        for rid, client in (("a0", "gw-a"), ("a1", "gw-a"), ("b0", "gw-b")):
            srv.call(lambda rid=rid, client=client: srv.engine.add_request(
                rid, [1, 2, 3], SamplingParams(max_tokens=5), client=client))
        got: dict[str, dict[str, int]] = {"gw-a": {}, "gw-b": {}}
        deadline = time.time() + 10
        while sum(len(v) for v in got.values()) < 3 or any(
                n < 5 for v in got.values() for n in v.values()):
            assert time.time() < deadline, got
            for client, seen in got.items():
                for o in srv.get_outputs(0.05, client):
                    seen[o.request_id] = seen.get(o.request_id, 0) + len(o.new_token_ids)
        assert got == {"gw-a": {"a0": 5, "a1": 5}, "gw-b": {"b0": 5}}
        assert srv.get_outputs(0.01) == []  # nothing went to the untagged outbox
    finally:
        srv.stop()


def test_the_step_log_marks_prefill_steps_and_times_the_step_thread():
    from llumnix.bench.step_log import step_stats

    srv, _ = _server()
    try:
        srv.call(lambda: srv.engine.add_request("r", [1, 2, 3, 4], SamplingParams(max_tokens=5)))
        assert len(_collect(srv, 1)["r"]) == 5
        log = list(srv.step_log)
    finally:
        srv.stop()
    assert [step[4] for step in log] == [True, False, False, False, False]  # one prefill, four decodes
    assert all(0 <= cpu <= end - start + 0.01 for start, end, _, cpu, *_ in log)
    assert [step[5:] for step in log] == [(4, 0), (1, 1), (1, 1), (1, 1), (1, 1)]  # tokens, decodes
    stats = step_stats([log])
    assert stats["num_steps"] == 5 and stats["count_by_batch"] == {"1": 5}
    assert set(stats["decode_mean_s_by_batch"]) == {"1"} and "1" in stats["wall_over_cpu_by_batch"]


def test_a_lost_poll_reply_is_sent_again_until_acknowledged():
    """Issue 28's soak: a reset connection lost a reply of get_outputs, which had already
    taken its outputs; the stream then waited forever for the missing token. Outputs now
    stay until a later poll acknowledges them."""
    srv, _ = _server()
    try:
        srv.call(lambda: srv.engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=6), client="gw"))
        deadline = time.time() + 10
        got: list = []
        while len(got) < 2 and time.time() < deadline:
            _, got = srv.poll_outputs(0.2, "gw", ack=0)  # replies "lost": nothing acknowledged
        last, again = srv.poll_outputs(0.2, "gw", ack=0)
        assert [o.num_output_tokens for o in again[:len(got)]] == [o.num_output_tokens for o in got]
        seen = [o.num_output_tokens for o in again]
        while not again or not again[-1].is_finished:
            last, again = srv.poll_outputs(0.5, "gw", ack=last)  # acknowledged: only newer ones
            assert not again or again[0].num_output_tokens == seen[-1] + 1
            seen += [o.num_output_tokens for o in again]
            assert time.time() < deadline
        assert seen == [1, 2, 3, 4, 5, 6]
        assert srv.poll_outputs(0.05, "gw", ack=last) == (last, [])
    finally:
        srv.stop()


def _outputs(srv, rid_done, timeout=10.0):
    """Every output until ``rid_done`` has finished (each output kept whole)."""
    got = []
    deadline = time.time() + timeout
    while time.time() < deadline and not any(o.request_id == rid_done and o.is_finished for o in got):
        got.extend(srv.get_outputs(0.1))
    return got


def test_a_final_only_request_is_sent_once_whole_beside_one_streamed_token_by_token():
    srv, _ = _server()
    try:
        def add():
            srv.engine.add_request("whole", [1, 2, 3], SamplingParams(max_tokens=6))
            srv.hold_until_final("whole")
            srv.engine.add_request("streamed", [1, 2, 4], SamplingParams(max_tokens=6))
        srv.call(add)
        got = _outputs(srv, "whole")
        got += _outputs(srv, "streamed") if not any(o.request_id == "streamed" and o.is_finished for o in got) else []
        whole = [o for o in got if o.request_id == "whole"]
        streamed = [o for o in got if o.request_id == "streamed"]
        assert len(whole) == 1 and whole[0].is_finished and whole[0].num_output_tokens == 6
        assert len(whole[0].new_token_ids) == 6 and whole[0].metrics is not None
        assert len(streamed) == 6 and all(len(o.new_token_ids) == 1 for o in streamed)
    finally:
        srv.stop()


def test_a_final_only_request_that_leaves_the_engine_sends_what_it_made_and_an_aborted_one_nothing():
    srv, _ = _server()
    real = srv.engine.executor.execute

    def slow(batch):
        time.sleep(0.005)
        return real(batch)

    srv.engine.executor.execute = slow  # 50 tokens take a quarter of a second, not a millisecond
    try:
        def add():
            for rid in ("leaves", "aborted"):
                srv.engine.add_request(rid, [1, 2, 3], SamplingParams(max_tokens=50))
                srv.hold_until_final(rid)
        srv.call(add)
        while srv.call(lambda: srv.engine.get_request("leaves").num_output_tokens) < 3:
            time.sleep(0.01)

        def leave_and_abort():
            made = srv.engine.get_request("leaves").num_output_tokens
            srv.engine.abort_request("leaves")  # stands for a migration's removal at the source
            srv.forget("aborted")
            srv.engine.abort_request("aborted")
            return made
        made = srv.call(leave_and_abort)
        got = []
        deadline = time.time() + 5
        while time.time() < deadline and not got:
            got = srv.get_outputs(0.1)
        assert [(o.request_id, o.num_output_tokens, len(o.new_token_ids), o.is_finished) for o in got] == [
            ("leaves", made, made, False)]
        assert srv.get_outputs(0.3) == []
        assert srv.call(lambda: srv.engine.kv.num_free_blocks) == 64
    finally:
        srv.stop()


def test_a_change_of_lifecycle_is_marked_for_the_lines_that_want_it_at_once():
    """A drain or a failed health flips a status's lifecycle without changing its load or
    its rescheduling marks. LlumSched's line (``urgent_marks``) must still get that status
    at once, not a gap later: it is the one road a status takes to LlumSched, and the
    dispatch and the rescheduling read the lifecycle."""
    eng = make_engine()
    eng.clock = __import__("llumnix.core.clock", fromlist=["WallClock"]).WallClock()
    statuses: list = []
    # never a destination, and a source only when terminating: a health flip leaves the
    # marks as they were
    llumlet = Llumlet(eng.instance_id, eng, ReschedulingConfig(in_threshold=1e9), FreenessConfig())
    srv = InstanceServer(eng, llumlet, on_status=statuses.append, status_interval_s=0.01)
    srv.start()
    try:
        srv.track_marks()
        srv.call(lambda: srv.engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=240)))
        deadline = time.time() + 5
        while not any(s.num_running for s in statuses) and time.time() < deadline:
            time.sleep(0.01)
        seqs = []
        for flag, value in (("is_schedulable", False), ("is_schedulable", True),
                            ("is_terminating", True), ("is_terminating", False)):
            before = srv.marks_seq
            srv.call(lambda flag=flag, value=value: setattr(srv.llumlet, flag, value))
            deadline = time.time() + 2
            while srv.marks_seq == before and time.time() < deadline:
                time.sleep(0.005)
            seqs.append(srv.marks_seq > before)
        assert seqs == [True, True, True, True]
        assert [s for s in statuses if not s.is_schedulable] and [s for s in statuses if s.is_terminating]
    finally:
        srv.stop()


def _wait_standing(srv, n: int) -> None:
    deadline = time.time() + 5
    while srv.call(lambda: len(srv._standing)) != n and time.time() < deadline:
        time.sleep(0.005)


def test_call_until_acts_at_the_very_boundary_a_step_makes_its_condition_true():
    """The condition is checked on the step thread right after each step, so the request
    is paused at the boundary after its third token however slow the caller's thread is."""
    srv, _ = _server()
    try:
        eng = srv.engine

        def third_token() -> int | bool:
            req = eng.requests.get("x")
            if req is None or len(req.output_token_ids) < 3:
                return False
            eng.pause_request("x")
            return len(req.output_token_ids)

        got = []
        t = threading.Thread(target=lambda: got.append(srv.call_until(third_token, 10.0)))
        t.start()
        _wait_standing(srv, 1)
        srv.call(lambda: eng.add_request("x", [1, 2, 3], SamplingParams(max_tokens=40)))
        t.join(5.0)
        assert got == [3]
        time.sleep(0.1)
        assert srv.call(lambda: len(eng.requests["x"].output_token_ids)) == 3
    finally:
        srv.stop()


def test_call_until_is_answered_by_a_command_when_no_step_follows():
    srv, _ = _server()
    try:
        eng = srv.engine
        got = []
        t = threading.Thread(target=lambda: got.append(srv.call_until(lambda: "yes" if eng.requests else False, 10.0)))
        t.start()
        _wait_standing(srv, 1)  # idle engine: no step will run, only a command can answer
        assert not got
        srv.call(lambda: eng.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2)))
        t.join(2.0)
        assert got == ["yes"]
    finally:
        srv.stop()


@pytest.mark.parametrize("timeout", [0.0, 0.05])  # 0: it times out before it is even registered
def test_call_until_that_times_out_never_runs_again(timeout):
    srv, _ = _server()
    try:
        runs = []
        with pytest.raises(TimeoutError):
            srv.call_until(lambda: runs.append(1) or False, timeout)
        n = len(runs)
        assert n >= 1
        for _ in range(3):  # each command's boundary would run it, were it still standing
            srv.call(lambda: None)
        assert len(runs) == n
        assert srv.call(lambda: srv._standing) == []
    finally:
        srv.stop()
