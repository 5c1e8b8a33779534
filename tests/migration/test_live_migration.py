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
from llumnix.migration.tcp_transport import KVSender, TransportError
from llumnix.policy import FreenessConfig, Llumlet, ReschedulingConfig
from tests.engine.helpers import make_engine, run_to_completion

TOKEN = b"cluster-secret"


class Pair:
    def __init__(self, num_blocks=64, dst_blocks=64, slow_s=0.002, dst_watermark=0.0):
        self.servers = []
        for iid, nb, wm in (("src", num_blocks, 0.0), ("dst", dst_blocks, dst_watermark)):
            eng = make_engine(num_blocks=nb, instance_id=iid, watermark=wm)
            eng.clock = WallClock()
            ex = eng.executor
            orig = ex.execute

            def slow(batch, orig=orig):
                time.sleep(slow_s)  # a step takes time, so migrations overlap decoding
                return orig(batch)

            ex.execute = slow
            srv = InstanceServer(eng, Llumlet(iid, eng, ReschedulingConfig(), FreenessConfig()))
            srv.start()
            self.servers.append(srv)
        self.src, self.dst = self.servers
        self.endpoint = DestinationEndpoint(self.dst, TOKEN, reservation_timeout_s=2.0)
        self.sender = KVSender(self.endpoint.address, TOKEN)
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
    eng = make_engine()
    eng.add_request("x", prompt, params)
    return run_to_completion(eng)["x"]


PROMPT = list(range(1, 30))


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=60),
                                    SamplingParams(max_tokens=60, temperature=0.7, seed=11)])
def test_migrated_request_produces_the_same_tokens_exactly_once(params):
    pair = Pair()
    try:
        pair.add("x", PROMPT, params)
        time.sleep(0.03)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig(max_stages=3))
        assert rep.committed, rep.abort_reason
        assert rep.num_stages >= 2 and rep.downtime is not None and rep.num_bytes > 0
        out = pair.collect("x")
        indices = sorted(i for i, _ in pair.tokens["x"])
        assert indices == list(range(1, 61))  # no gap, no duplicate
        assert out == reference(PROMPT, params)
        pair.check_drained()
    finally:
        pair.close()


def test_back_and_forth():
    pair = Pair()
    back_endpoint = DestinationEndpoint(pair.src, TOKEN)
    back_sender = KVSender(back_endpoint.address, TOKEN)
    try:
        pair.add("x", PROMPT, SamplingParams(max_tokens=80))
        time.sleep(0.03)
        assert migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig()).committed
        time.sleep(0.03)
        assert migrate("x", pair.dst, back_endpoint, back_sender, MigrationConfig()).committed
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=80))
        pair.check_drained()
    finally:
        back_sender.close()
        back_endpoint.close()
        pair.close()


def test_queued_request_moves_as_metadata():
    pair = Pair()
    try:
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
    finally:
        pair.close()


def test_reservation_refused_aborts_and_the_request_finishes_on_the_source():
    pair = Pair(dst_blocks=4)
    try:
        pair.add("x", PROMPT, SamplingParams(max_tokens=30))
        time.sleep(0.03)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed and "refused" in rep.abort_reason
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=30))
        pair.check_drained()
    finally:
        pair.close()


def test_request_that_finishes_mid_migration_aborts_cleanly():
    pair = Pair(slow_s=0.0)
    try:
        pair.add("x", PROMPT, SamplingParams(max_tokens=3))
        time.sleep(0.01)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed
        time.sleep(0.05)
        pair.check_drained()
    except KeyError:
        pass  # it finished before the migration began: also a clean outcome
    finally:
        pair.close()


def test_client_abort_mid_migration():
    pair = Pair(slow_s=0.005)
    try:
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
    finally:
        pair.close()


def test_destination_dies_mid_stage_and_the_source_carries_on():
    pair = Pair()
    try:
        pair.add("x", PROMPT, SamplingParams(max_tokens=40))
        time.sleep(0.03)
        pair.endpoint.receiver.close()
        pair.sender.close()  # the connection is gone
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig())
        assert not rep.committed
        assert pair.collect("x") == reference(PROMPT, SamplingParams(max_tokens=40))
        time.sleep(2.6)  # the destination's watchdog frees the orphaned reservation
        pair.check_drained()
    finally:
        pair.close()


def test_timeout_aborts():
    pair = Pair(slow_s=0.002)
    try:
        pair.add("x", PROMPT, SamplingParams(max_tokens=100))
        time.sleep(0.02)
        rep = migrate("x", pair.src, pair.endpoint, pair.sender, MigrationConfig(timeout_s=1e-6))
        assert not rep.committed and rep.abort_reason == "timeout"
        assert len(pair.collect("x")) == 100
        pair.check_drained()
    finally:
        pair.close()


def test_wrong_token_is_refused():
    pair = Pair()
    try:
        with pytest.raises(TransportError):
            KVSender(pair.endpoint.address, b"not the token").send({"request_id": "x", "block_ids": [0]}, b"x")
    finally:
        pair.close()


def test_request_preempted_mid_migration_aborts_and_completes_on_the_source():
    pair = Pair(slow_s=0.003)
    try:
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
    finally:
        pair.close()
