"""Live migration between two running instances over real TCP sockets."""
from __future__ import annotations

import time

import pytest

from llumnix.cluster.instance import InstanceServer
from llumnix.core.clock import WallClock
from llumnix.core.sampling_params import SamplingParams
from llumnix.migration import MigrationConfig
from llumnix.migration.destination import DestinationEndpoint
from llumnix.migration.driver import migrate
from llumnix.migration.gloo_transport import GlooSender
from llumnix.migration.tcp_transport import KVSender, TransportError
from llumnix.migration.transport import TransportOptions
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from tests.engine.helpers import make_engine, run_to_completion

TOKEN = b"cluster-secret"


# Steps here take milliseconds, so a bulk copy at nice 19 on a loaded machine could
# let the request finish first; these tests check correctness, at normal priority
# (tests/migration/test_processes.py runs the default, niced copies).
OPTIONS = TransportOptions(bulk_nice=0)


def open_sender(transport, endpoint, options=OPTIONS):
    if transport == "gloo":
        return GlooSender(endpoint.accept_gloo, TOKEN,
                          options=options)
    return KVSender(endpoint.address, TOKEN, options)


class Pair:
    # 10 ms a step: a request of 30-80 tokens decodes for 0.3-0.8 s, so a migration that
    # takes 0.2-0.3 s on a loaded machine still finds it running (at 2 ms, 4-5 of these
    # tests failed with "the request finished" whenever two simulations ran beside them).
    def __init__(self, num_blocks=64, dst_blocks=64, slow_s=0.01, dst_watermark=0.0, transport="tcp",
                 dst_slow_s=None, prefix_caching=False, chunk_tokens=None):
        self.servers = []
        self.step_s = {"src": slow_s, "dst": slow_s if dst_slow_s is None else dst_slow_s}
        for iid, nb, wm in (("src", num_blocks, 0.0), ("dst", dst_blocks, dst_watermark)):
            # chunk_tokens: chunked prefill at that many tokens a step (a PD prefill instance)
            eng = make_engine(num_blocks=nb, instance_id=iid, watermark=wm, prefix_caching=prefix_caching,
                              chunked=chunk_tokens is not None, max_batched=chunk_tokens or 256)
            eng.clock = WallClock()
            ex = eng.executor
            orig = ex.execute

            def slow(batch, orig=orig, iid=iid):
                time.sleep(self.step_s[iid])  # a step takes time, so migrations overlap decoding
                return orig(batch)

            ex.execute = slow
            srv = InstanceServer(eng, Llumlet(iid, eng, ReschedulingConfig(), FreenessConfig()))
            srv.start()
            self.servers.append(srv)
        self.src, self.dst = self.servers
        self.endpoint = DestinationEndpoint(self.dst, TOKEN, reservation_timeout_s=2.0, options=OPTIONS)
        self.sender = open_sender(transport, self.endpoint)
        self.tokens: dict[str, list[tuple[int, int]]] = {}

    def add(self, rid, prompt, params):
        self.src.call(lambda: self.src.engine.add_request(rid, prompt, params))

    def collect(self, rid, timeout=20.0):
        """Outputs of ``rid`` from both instances, as (index, token), until it finishes."""
        seen = self.tokens.setdefault(rid, [])
        deadline = time.time() + timeout
        while time.time() < deadline:
            for srv in self.servers:
                for o in srv.get_outputs(0.01):
                    self.tokens.setdefault(o.request_id, []).append((o.num_output_tokens, o.new_token_ids[0]))
                    if o.request_id == rid and o.is_finished:
                        return [t for _, t in sorted(seen)]
        raise AssertionError(f"{rid} did not finish")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.sender.close()
        self.endpoint.close()
        for srv in self.servers:
            srv.stop()

    def check_drained(self):
        for srv in self.servers:
            srv.call(srv.engine.check_invariants)
            assert srv.call(lambda s=srv: s.engine.kv.num_free_blocks) == srv.engine.kv.num_total_blocks


def reference(prompt, params):
    eng = make_engine(num_blocks=256)  # room for the longest request here
    eng.add_request("x", prompt, params)
    return run_to_completion(eng)["x"]


PROMPT = list(range(1, 30))


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
# 150 tokens (1.5 s at 10 ms a step): under load a gloo migration, which opens its
# process group on first use, took up to 0.9 s.
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=150),
                                    SamplingParams(max_tokens=150, temperature=0.7, seed=11)])
def test_migrated_request_produces_the_same_tokens_exactly_once(params, transport):
    with Pair(transport=transport) as pair:
        pair.add("x", PROMPT, params)
        time.sleep(0.03)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig(max_stages=3))
        assert rep.committed, rep.abort_reason
        assert rep.num_stages >= 2 and rep.downtime is not None and rep.num_bytes > 0
        out = pair.collect("x")
        indices = sorted(i for i, _ in pair.tokens["x"])
        assert indices == list(range(1, params.max_tokens + 1))  # no gap, no duplicate
        assert out == reference(PROMPT, params)
        pair.check_drained()


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_blocks_the_destination_caches_are_adopted_not_sent(transport):
    """Prefix caching: the destination runs a request sharing x's first 20 tokens, so
    x's first 5 blocks are adopted there by their keys; only the rest travels, and x
    still produces every token exactly once, as without migration."""
    # 240 tokens (2.4 s): under load 12+ a gloo pair's first migration outlasted 120 (source_finished)
    params = SamplingParams(max_tokens=240)
    with Pair(num_blocks=128, dst_blocks=160, prefix_caching=True, transport=transport) as pair:
        pair.dst.call(lambda: pair.dst.engine.add_request("other", PROMPT[:20] + [7, 8], SamplingParams(max_tokens=200)))
        pair.add("x", PROMPT, params)
        time.sleep(0.05)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig(max_stages=3))
        assert rep.committed, rep.abort_reason
        assert rep.num_blocks_cached == 5
        assert 0 < rep.num_blocks <= (len(PROMPT) + params.max_tokens) // 4 + 1 - 5
        out = pair.collect("x")
        assert sorted(i for i, _ in pair.tokens["x"]) == list(range(1, params.max_tokens + 1))
        assert out == reference(PROMPT, params)
        pair.dst.call(lambda: pair.dst.engine.abort_request("other"))
        pair.check_drained()


def test_the_client_tag_travels_with_the_request():
    """After migration the destination's outputs go to the same gateway's outbox."""
    with Pair() as pair:
        pair.src.call(lambda: pair.src.engine.add_request("x", PROMPT, SamplingParams(max_tokens=40),
                                                          client="gw-1"))
        time.sleep(0.03)
        assert migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig()).committed
        done, n = False, 0
        deadline = time.time() + 20
        while not done:
            assert time.time() < deadline
            assert pair.dst.get_outputs(0.0) == []  # untagged outbox: never this request's
            for o in pair.dst.get_outputs(0.02, "gw-1"):
                n, done = o.num_output_tokens, o.is_finished
        assert n == 40
        pair.check_drained()


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_back_and_forth(transport):
    pair = Pair(num_blocks=128, dst_blocks=128, transport=transport)
    back_endpoint = DestinationEndpoint(pair.src, TOKEN, options=OPTIONS)
    back_sender = open_sender(transport, back_endpoint)
    try:
        # two migrations: room for both (3 s; with 150 tokens, under load 12+, a gloo pair's
        # second migration found the request finished)
        pair.add("x", PROMPT, SamplingParams(max_tokens=300))
        time.sleep(0.03)
        assert migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig()).committed
        time.sleep(0.03)
        back = migrate("x", pair.dst, back_endpoint, back_sender, MigrationConfig())
        assert back.committed, back
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=300))
        pair.check_drained()
    finally:
        back_sender.close()
        back_endpoint.close()
        pair.close()


def test_queued_request_moves_as_metadata():
    with Pair() as pair:
        pair.src.call(lambda: pair.src.engine.scheduler.__setattr__("config", type(
            pair.src.engine.scheduler.config)(max_num_seqs=1, max_num_batched_tokens=256)))
        pair.add("busy", PROMPT, SamplingParams(max_tokens=40))
        pair.add("q", PROMPT[:5], SamplingParams(max_tokens=10))
        time.sleep(0.02)
        rep = migrate("q", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert rep.committed and rep.num_stages == 0
        assert pair.collect("q") == reference(PROMPT[:5], SamplingParams(max_tokens=10))
        pair.collect("busy")
        pair.check_drained()


def test_reservation_refused_aborts_and_the_request_finishes_on_the_source():
    with Pair(dst_blocks=4) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=30))
        time.sleep(0.03)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed and "refused" in rep.abort_reason and rep.abort_code == "refused"
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=30))
        pair.check_drained()


def test_request_that_finishes_mid_migration_aborts_cleanly():
    with Pair(slow_s=0.0) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=3))
        time.sleep(0.01)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed and rep.abort_code == "source_finished"  # before it began, or during
        time.sleep(0.05)
        pair.check_drained()


def test_a_pick_that_races_with_the_requests_end_is_a_typed_abort_not_an_error():
    """A migration round picks a request at one step boundary and the migration reads it
    at the next: a request that finished in between aborts as ``source_finished`` (it
    raised a bare KeyError, which the instance actor reported as its text and answered by
    closing every KV channel it had open)."""
    with Pair() as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=2))
        picked = pair.src.call(lambda: list(pair.src.engine.requests))
        pair.collect("x")  # it ends before the migration starts
        rep = migrate(picked[0], pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert (rep.committed, rep.abort_code, rep.num_stages, rep.downtime) == (False, "source_finished", 0, None)
        assert "finished before its migration began" in rep.abort_reason
        # nothing was started on either side, and the channel still carries a migration
        pair.check_drained()
        pair.add("y", PROMPT, SamplingParams(max_tokens=150))
        time.sleep(0.03)
        assert migrate("y", pair.src, pair.endpoint, pair.sender, MigrationConfig()).committed
        assert pair.collect("y") == reference(PROMPT, SamplingParams(max_tokens=150))
        pair.check_drained()


def test_client_abort_mid_migration():
    with Pair(slow_s=0.005) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=200))
        time.sleep(0.02)
        eng = pair.src.engine
        orig = eng.blocks_since

        def abort_then(*a, **kw):
            eng.abort_request("x")  # the client went away while the stage ran
            eng.blocks_since = orig
            return []

        eng.blocks_since = abort_then
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed
        pair.check_drained()


def test_destination_dies_mid_stage_and_the_source_carries_on():
    with Pair() as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=40))
        time.sleep(0.03)
        pair.endpoint.receiver.close()
        pair.sender.close()  # the connection is gone
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=40))
        time.sleep(2.6)  # the destination's watchdog frees the orphaned reservation
        pair.check_drained()


def test_timeout_aborts():
    with Pair(slow_s=0.002) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=100))
        time.sleep(0.02)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig(timeout_s=1e-6))
        assert not rep.committed and rep.abort_reason == "timeout"
        assert len(pair.collect("x")) == 100
        pair.check_drained()


def test_wrong_token_is_refused():
    with Pair() as pair, pytest.raises(TransportError):
        KVSender(pair.endpoint.address, b"not the token").send({"request_id": "x", "block_ids": [0]}, b"x")


def test_request_preempted_mid_migration_aborts_and_completes_on_the_source():
    with Pair(slow_s=0.003) as pair:
        pair.add("x", PROMPT, SamplingParams(max_tokens=60))
        time.sleep(0.02)
        eng = pair.src.engine
        orig = eng.blocks_since
        calls = {"n": 0}

        def preempt_on_second_stage(*a, **kw):
            calls["n"] += 1
            if calls["n"] == 2:
                eng.scheduler.preempt(eng.requests["x"])  # recompute preemption mid-migration
            return orig(*a, **kw)

        eng.blocks_since = preempt_on_second_stage
        rep = migrate("x", pair.src, pair.endpoint, pair.sender,
                      MigrationConfig(max_stages=4, last_stage_max_blocks=0))
        eng.blocks_since = orig
        assert not rep.committed
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=60))
        pair.check_drained()


def test_install_does_not_wait_for_the_destination_step_and_downtime_runs_to_its_first_step():
    """The destination queues the request for its next boundary (an inbox) instead of
    making the source wait out its current step; the downtime runs from the source's
    pausing boundary to the start of the destination's first step with the request
    (issue 29: the wait for that step is part of the stall), and it resumes there."""
    with Pair(slow_s=0.02, dst_slow_s=0.2) as pair:
        pair.dst.call(lambda: pair.dst.engine.add_request("busy", PROMPT, SamplingParams(max_tokens=100)))
        pair.add("x", PROMPT, SamplingParams(max_tokens=80))
        time.sleep(0.1)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert rep.committed, rep.abort_reason
        paused, resumed = rep.marks["paused"], rep.marks["resumed"]
        assert 0 < rep.end_time - paused < 0.1  # the commit did not wait out a 0.2 s destination step
        assert rep.downtime == pytest.approx(resumed - paused)
        installed = pair.endpoint.installed_at["x"]
        assert rep.start_time <= paused < installed <= resumed
        pair.step_s["dst"] = 0.002
        assert pair.collect("x", timeout=60) == reference(PROMPT, SamplingParams(max_tokens=80))
        # One clock in this process: the estimate is that step's start, to the install call's hops.
        first = min(t0 for t0, *_ in list(pair.dst.step_log) if t0 >= installed)
        assert resumed == pytest.approx(first, abs=0.01)
        pair.dst.call(lambda: pair.dst.engine.abort_request("busy"))
        pair.check_drained()


def test_receiver_refuses_blocks_not_reserved_for_the_request():
    with Pair() as pair:
        pair.dst.call(lambda: pair.dst.engine.add_request("victim", PROMPT, SamplingParams(max_tokens=5)))
        pair.collect("victim")
        ids = pair.endpoint.try_reserve("x", 2)
        assert ids is not None
        other = next(b for b in range(64) if b not in ids)
        bpb = pair.dst.engine.executor.bytes_per_block
        assert not pair.sender.send_raw({"request_id": "x", "block_ids": [other]}, b"\x01" * bpb)
        assert not pair.sender.send_raw({"request_id": "y", "block_ids": ids[:1]}, b"\x01" * bpb)
        assert not pair.sender.send_raw({"request_id": "x", "block_ids": ids[:1]}, b"\x01" * 3)  # wrong size
        assert pair.sender.send_raw({"request_id": "x", "block_ids": ids[:1]}, b"\x01" * bpb)
        assert pair.endpoint.release("x") == 2
        pair.check_drained()


def test_last_stage_transport_failure_resumes_the_paused_request_on_the_source():
    with Pair() as pair:
        orig = pair.sender.send

        def drop_urgent(request_id, block_ids, src, *, urgent=False):
            if urgent:  # the link drops while the request is paused
                raise TransportError("link dropped in the last stage")
            return orig(request_id, block_ids, src, urgent=urgent)

        pair.sender.send = drop_urgent
        pair.add("x", PROMPT, SamplingParams(max_tokens=60))
        time.sleep(0.03)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed and "last stage" in rep.abort_reason
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=60))
        pair.check_drained()
