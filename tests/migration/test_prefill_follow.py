"""Following a prefill (``MigrationConfig.follow_prefill``, the PD hand-off of a prompt
prefilled in chunks): each finished chunk's full blocks go to the destination while the
next chunk computes, and the request is paused right after its first token, so the last
stage copies only the tail. Real instances, real TCP; every abort path leaves both block
pools exact the moment ``migrate`` returns."""
from __future__ import annotations

import threading
import time

import pytest

from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.destination import DestinationEndpoint
from llumnix.migration.driver import migrate
from tests.migration.test_live_migration import OPTIONS, TOKEN, Pair, open_sender, reference

PROMPT = [(7 * i) % 900 + 1 for i in range(128)]  # 32 blocks of 4, 16 chunks of 8 tokens: 0.5 s of prefill
FOLLOW = MigrationConfig(follow_prefill=True)


def _free(srv) -> int:
    return srv.call(lambda: srv.engine.kv.num_free_blocks)


class _PacedPrefill:
    """The source as ``migrate`` sees it, with ``rid``'s progress there held to the
    migration's pace. A step with a prefill chunk of ``rid`` short of the prompt's end runs
    if no such chunk has run since the last copy (``sender.send``) began; any step with
    ``rid`` (its last chunk, a decode) runs while a caller waits for a source boundary
    (``call``, ``call_until``: the next chunk the driver waits for, or a boundary a held
    step would keep from coming). So its first chunk computes before the migration starts,
    one more while each copy runs, its first token comes while the driver waits at the
    boundary for it, and it cannot end on the source within a stage, however the threads
    are scheduled: under load a starved test or migration thread let the 0.5 s prefill end
    within the first stage (``num_prefill_stages`` 1). Other requests are never held;
    nothing the step thread waits for needs it, and a hold longer than ``timeout_s`` lets
    the step go and is recorded (``waited_out``), so the test fails, never hangs.

    The pair's destination is replaced by one whose reservations outlive 30 s without a
    write (the cluster's default is twice the migration timeout), not ``Pair``'s 2 s: a
    followed prefill writes once per stage, and at load 10+ a gap of 2 s between two of
    them (a starved thread) had the watchdog free the reservation (``kv_refused``), with
    or without the pace."""

    def __init__(self, pair: Pair, rid: str, timeout_s: float = 20.0) -> None:
        pair.sender.close()
        pair.endpoint.close()
        pair.endpoint = DestinationEndpoint(pair.dst, TOKEN, reservation_timeout_s=30.0, options=OPTIONS)
        pair.sender = open_sender("tcp", pair.endpoint)
        self.srv = pair.src
        self.instance_id, self.engine, self.llumlet = self.srv.instance_id, self.srv.engine, self.srv.llumlet
        self.num_sends = self.num_held = self._num_waiting = self._chunks_since_send = 0
        self.waited_out = False
        self._cv = threading.Condition()
        send, execute = pair.sender.send, self.engine.executor.execute

        def counted_send(*args, **kw):
            with self._cv:
                self.num_sends += 1
                self._chunks_since_send = 0
                self._cv.notify_all()
            return send(*args, **kw)

        def paced_execute(batch):
            mine = next((e for e in batch.scheduled if e.request_id == rid), None)
            if mine is not None:
                def free() -> bool:
                    return self._num_waiting > 0 or (not mine.sample and self._chunks_since_send == 0)

                with self._cv:
                    if not free():
                        self.num_held += 1
                        if not self._cv.wait_for(free, timeout_s):
                            self.waited_out = True
                    self._chunks_since_send += not mine.sample
            return execute(batch)

        pair.sender.send = counted_send
        self.engine.executor.execute = paced_execute

    def _waiting(self, fn, once: bool):
        """``fn`` counted as waited for from now until it has run (``once``) or returned
        something other than False at a boundary; and the closing call, for the caller's
        ``finally``."""
        is_open = [True]

        def close() -> None:
            with self._cv:
                if is_open[0]:
                    is_open[0] = False
                    self._num_waiting -= 1

        def run():
            got = fn()
            if once or got is not False:
                close()
            return got

        with self._cv:
            self._num_waiting += 1
            self._cv.notify_all()
        return run, close

    def call(self, fn, timeout: float = 30.0):
        run, close = self._waiting(fn, once=True)
        try:
            return self.srv.call(run, timeout)
        finally:
            close()

    def call_until(self, fn, timeout: float):
        run, close = self._waiting(fn, once=False)
        try:
            return self.srv.call_until(run, timeout)
        finally:
            close()


def _wait_for_chunk(pair: Pair, rid: str, num_tokens: int = 8, src=None) -> None:
    deadline = time.time() + 10
    src = src or pair.src
    eng = src.engine
    while src.call(lambda: eng.requests[rid].num_computed_tokens) < num_tokens:
        assert time.time() < deadline, "no chunk computed"
        time.sleep(0.002)


def test_a_followed_prefill_sends_its_chunks_early_and_only_the_tail_after_its_first_token():
    params = SamplingParams(max_tokens=40)
    with Pair(chunk_tokens=8, slow_s=0.03) as pair:
        paced = _PacedPrefill(pair, "x")
        pair.add("x", PROMPT, params)
        _wait_for_chunk(pair, "x", src=paced)
        rep = migrate("x", paced, pair.endpoint, pair.sender, FOLLOW)
        assert rep.committed, rep.abort_reason
        assert not paced.waited_out and paced.num_held > 0  # the pace held the prefill, never for good
        assert rep.num_prefill_stages >= 2  # chunks copied while the next ones computed
        assert rep.num_last_stage_blocks < 16  # the tail, not the 32-block prompt
        assert rep.num_blocks >= 32 and rep.downtime is not None
        out = pair.collect("x")
        assert sorted(i for i, _ in pair.tokens["x"]) == list(range(1, 41))  # each token once
        assert out == reference(PROMPT, params)
        pair.check_drained()


def test_behind_prompt_work_a_followed_request_is_paused_at_the_boundary_after_its_first_token():
    """Another prompt waits on the source: the request's next steps there would be prefill
    chunks, so it is paused right after its first token (made there, and only it) and its
    tail copied at once."""
    params = SamplingParams(max_tokens=30)
    with Pair(chunk_tokens=8, slow_s=0.03, num_blocks=128) as pair:
        paced = _PacedPrefill(pair, "x")
        paced.call(lambda: (pair.src.engine.add_request("x", PROMPT, params),
                            pair.src.engine.add_request("y", PROMPT[::-1], params)))  # y queued behind x's chunks
        _wait_for_chunk(pair, "x", src=paced)
        rep = migrate("x", paced, pair.endpoint, pair.sender, FOLLOW)
        assert rep.committed, rep.abort_reason
        assert not paced.waited_out and paced.num_held > 0
        assert rep.num_prefill_stages >= 2 and rep.num_last_stage_blocks < 16
        made_here = [o for o in pair.src.get_outputs(0.05) if o.request_id == "x"]
        assert [o.num_output_tokens for o in made_here] == [1]
        pair.tokens["x"] = [(1, made_here[0].new_token_ids[0])]
        assert pair.collect("x") == reference(PROMPT, params)
        assert sorted(i for i, _ in pair.tokens["x"]) == list(range(1, 31))
        assert pair.collect("y") == reference(PROMPT[::-1], params)
        pair.check_drained()


@pytest.mark.parametrize("case", ["refused", "client_abort", "ends_at_first_token"])
def test_every_abort_while_following_leaves_both_pools_exact_at_once(case):
    params = SamplingParams(max_tokens=1 if case == "ends_at_first_token" else 40)
    with Pair(chunk_tokens=8, slow_s=0.03, dst_blocks=8 if case == "refused" else 64) as pair:
        dst_total = pair.dst.engine.kv.num_total_blocks
        pair.add("x", PROMPT, params)
        _wait_for_chunk(pair, "x")
        reports = []
        t = threading.Thread(target=lambda: reports.append(migrate("x", pair.src, pair.endpoint, pair.sender,
                                                                   FOLLOW)))
        t.start()
        if case == "client_abort":
            deadline = time.time() + 10
            while _free(pair.dst) == dst_total and time.time() < deadline:  # reserved there: mid-hand-off
                time.sleep(0.002)
            pair.src.call(lambda: pair.src.engine.abort_request("x"))
        t.join(20)
        rep = reports[0]
        assert not rep.committed
        assert rep.abort_code == {"refused": "refused", "client_abort": "source_finished",
                                  "ends_at_first_token": "source_finished"}[case], rep.abort_reason
        assert _free(pair.dst) == dst_total  # exact the moment migrate returned
        if case != "client_abort":
            assert pair.collect("x") == reference(PROMPT, params)  # it finished where it was
        pair.check_drained()


class _EndsAfterStart:
    """The source, with the request ended by a client at the boundary right after the one
    where its migration started (it finished or was aborted meanwhile)."""

    def __init__(self, srv, rid: str) -> None:
        self.srv, self.rid, self.calls = srv, rid, 0
        self.instance_id, self.engine, self.llumlet = srv.instance_id, srv.engine, srv.llumlet

    def call(self, fn, timeout: float = 30.0):
        self.calls += 1
        if self.calls == 2:
            self.srv.call(lambda: self.engine.abort_request(self.rid))
        return self.srv.call(fn, timeout)

    def call_until(self, fn, timeout: float):
        self.calls += 1
        if self.calls == 2:
            self.srv.call(lambda: self.engine.abort_request(self.rid))
        return self.srv.call_until(fn, timeout)


class _Counting:
    def __init__(self, endpoint) -> None:
        self.endpoint, self.instance_id, self.reserved = endpoint, endpoint.instance_id, []

    def try_reserve(self, request_id, num_blocks):
        self.reserved.append(num_blocks)
        return self.endpoint.try_reserve(request_id, num_blocks)

    def __getattr__(self, name):
        return getattr(self.endpoint, name)


@pytest.mark.parametrize("config", [MigrationConfig(merge_boundaries=False), FOLLOW])
def test_a_request_that_ends_before_its_first_stage_reserves_nothing_at_the_destination(config):
    """tests/cluster/test_pd_handoff.py's refused-reservation test saw 3 of 4 decode blocks
    free right after its request finished (1 run in 14): a request that ended between its
    migration's start and first stage went to the last stage, whose top-up reserved one
    block for it before finding it gone; the abort freed it moments later. (With
    ``merge_boundaries``, the default, nothing lies between the two: the next test.)"""
    with Pair(slow_s=0.02) as pair:
        pair.add("x", PROMPT[:29], SamplingParams(max_tokens=100))
        time.sleep(0.05)
        dst = _Counting(pair.endpoint)
        rep = migrate("x", _EndsAfterStart(pair.src, "x"), dst, pair.sender, config)
        assert not rep.committed and rep.abort_code == "source_finished"
        assert dst.reserved == []
        pair.check_drained()


def test_a_request_that_ends_after_its_first_stage_reserves_nothing_more():
    """Its first stage begins at the migration's first boundary; it ends by the next (the
    post-stage check): aborted there, the first stage's reservation freed, no last stage's
    top-up reserved for it."""
    with Pair(slow_s=0.02) as pair:
        pair.add("x", PROMPT[:29], SamplingParams(max_tokens=100))
        time.sleep(0.05)
        dst = _Counting(pair.endpoint)
        rep = migrate("x", _EndsAfterStart(pair.src, "x"), dst, pair.sender, MigrationConfig())
        assert not rep.committed and rep.abort_code == "source_finished"
        assert rep.num_stages == 1 and len(dst.reserved) == 1
        assert pair.endpoint.num_reservations() == 0
        pair.check_drained()


def test_a_one_chunk_prompt_behind_prompt_work_is_paused_right_after_its_first_token():
    """The hand-off starts while the prompt's only chunk computes; another prompt is still
    in its chunks when the first token comes out, so the request is paused at that very
    boundary (it makes no second token there) and copied whole in one stage."""
    params = SamplingParams(max_tokens=20)
    with Pair(chunk_tokens=64, slow_s=0.1, num_blocks=128) as pair:
        eng = pair.src.engine
        pair.src.call(lambda: (eng.add_request("x", PROMPT[:29], params),  # 29 + 35 tokens in the
                               eng.add_request("y", PROMPT, params)))  # first step, y's rest after
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, FOLLOW)
        assert rep.committed, rep.abort_reason
        assert rep.num_stages == 1 and rep.num_last_stage_blocks == 8  # 29 tokens + 1: 8 blocks of 4
        made_here = [o for o in pair.src.get_outputs(0.05) if o.request_id == "x"]
        assert [o.num_output_tokens for o in made_here] == [1]
        pair.tokens["x"] = [(1, made_here[0].new_token_ids[0])]
        assert pair.collect("x") == reference(PROMPT[:29], params)
        assert pair.collect("y") == reference(PROMPT, params)
        pair.check_drained()


def test_a_request_paused_at_the_first_boundary_is_resumed_when_the_destination_refuses():
    params = SamplingParams(max_tokens=20)
    with Pair(chunk_tokens=64, slow_s=0.1, num_blocks=128, dst_blocks=4) as pair:
        eng = pair.src.engine
        pair.src.call(lambda: (eng.add_request("x", PROMPT[:29], params), eng.add_request("y", PROMPT, params)))
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, FOLLOW)
        assert not rep.committed and rep.abort_code == "refused", rep.abort_reason
        assert _free(pair.dst) == 4
        assert pair.collect("x") == reference(PROMPT[:29], params)  # resumed where it was
        assert pair.collect("y") == reference(PROMPT, params)
        pair.check_drained()


def test_a_prefill_whose_computed_blocks_the_destination_caches_is_never_paused_mid_prefill():
    """Prefix caching: the decode instance caches the prompt's first 24 blocks, so the first
    stage adopts every block computed so far and sends none; that must not move the request
    before its first token (it would finish its prefill on the decode instance)."""
    params = SamplingParams(max_tokens=30)
    with Pair(chunk_tokens=8, slow_s=0.03, prefix_caching=True, num_blocks=128, dst_blocks=128) as pair:
        pair.dst.call(lambda: pair.dst.engine.add_request("other", PROMPT[:96] + [7, 8],
                                                          SamplingParams(max_tokens=400)))
        pair.add("x", PROMPT, params)
        _wait_for_chunk(pair, "x")
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, FOLLOW)
        assert rep.committed, rep.abort_reason
        assert rep.num_blocks_cached >= 2
        made_here = [o for o in pair.src.get_outputs(0.05) if o.request_id == "x"]
        assert made_here and made_here[0].num_output_tokens == 1  # its first token came from the source
        pair.tokens["x"] = [(o.num_output_tokens, o.new_token_ids[0]) for o in made_here]
        assert pair.collect("x") == reference(PROMPT, params)
        pair.dst.call(lambda: pair.dst.engine.abort_request("other"))
        pair.check_drained()
