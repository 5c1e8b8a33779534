"""The simulator driving real engines, with a stand-in scheduling system."""
from __future__ import annotations

import dataclasses
import json

import pytest

from llumnix.migration.protocol import MigrationConfig, MigrationPhase, MigrationProtocol
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.latency import fit_a10_llama7b
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import TraceSpec, make_trace
from tests.sim.standin import StandInPolicy

SMALL = ClusterConfig(num_instances=3, num_blocks=300, max_num_batched_tokens=4096, max_model_len=4096,
                      check_invariants=True)


def _trace(n=150, rate=3.0, seed=0, kind="M-M"):
    return make_trace(TraceSpec(kind, kind, num_requests=n), rate, seed)


def test_migrations_go_through_the_protocol_and_keep_block_accounting_exact(monkeypatch):
    transitions = []
    for name in ("begin_stage", "on_reserved", "on_copied", "on_paused", "on_committed", "abort"):
        orig = getattr(MigrationProtocol, name)

        def wrapped(self, *a, _orig=orig, _name=name, **kw):
            transitions.append(_name)
            return _orig(self, *a, **kw)

        monkeypatch.setattr(MigrationProtocol, name, wrapped)
    policy = StandInPolicy("least-loaded", enable_migration=True, migrate_gap_blocks=20)
    sim = Simulator(SMALL, fit_a10_llama7b(), policy, _trace(kind="L-L", rate=1.0))
    out = sim.run()
    assert out["num_finished"] + out["num_rejected"] == 150 and out["num_finished"] > 140
    mig = out["migrations"]
    assert mig["num_committed"] > 5
    assert transitions.count("on_committed") == mig["num_committed"]
    assert {"begin_stage", "on_reserved", "on_copied", "on_paused"} <= set(transitions)
    assert 0.010 < mig["downtime"]["p50"] < 0.05  # last stage only: flat, tens of ms
    for inst in sim.cluster.instances.values():
        inst.engine.check_invariants()
        assert not inst.engine.requests and not inst.migrations_in and not inst.migrations_out
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
        assert inst.executor.num_copying == 0


def test_mid_migration_finish_or_preemption_aborts_and_frees_the_reservation():
    # Tiny instances and long requests: migrations race with finishes and preemptions.
    cfg = ClusterConfig(num_instances=2, num_blocks=120, max_num_batched_tokens=2048, max_model_len=1900,
                        check_invariants=True, migration=MigrationConfig(max_stages=4, last_stage_max_blocks=0))
    policy = StandInPolicy("round-robin", enable_migration=True, migrate_gap_blocks=5)
    sim = Simulator(cfg, fit_a10_llama7b(), policy, _trace(n=120, rate=2.0, kind="S-M"))
    out = sim.run()
    assert out["num_finished"] + out["num_rejected"] == 120
    assert out["migrations"]["num_aborted"] > 0
    for inst in sim.cluster.instances.values():
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
        assert not inst.engine.kv.reserved_ids()


def test_same_seed_gives_identical_metrics():
    def run():
        sim = Simulator(SMALL, fit_a10_llama7b(), StandInPolicy("least-loaded", True), _trace(seed=5))
        out = sim.run()
        out.pop("sim")
        return json.dumps(out, sort_keys=True)

    assert run() == run()


def test_dispatch_choice_matters_and_gateway_queues_when_nothing_is_schedulable():
    fast = dataclasses.replace(SMALL, check_invariants=False)
    rr = Simulator(fast, fit_a10_llama7b(), StandInPolicy("round-robin"), _trace(n=120, rate=0.6)).run()
    ll = Simulator(fast, fit_a10_llama7b(), StandInPolicy("least-loaded"), _trace(n=120, rate=0.6)).run()
    assert ll["prefill"]["p99"] < rr["prefill"]["p99"]

    class Closed(StandInPolicy):
        opens_at = 5.0

        def dispatch(self, *a):
            return None if self._now() < self.opens_at else super().dispatch(*a)

    pol = Closed()
    sim = Simulator(SMALL, fit_a10_llama7b(), pol, _trace(n=30, rate=10.0))
    out = sim.run()
    assert out["num_finished"] + out["num_rejected"] == 30
    assert out["prefill"]["p50"] > 2.0  # they waited at the gateway


def test_decode_steps_pay_the_migration_slowdown():
    from llumnix.sim.calibration_report import measure_migration

    downtime, step = measure_migration(fit_a10_llama7b(), 2048)
    assert step == pytest.approx(43.8e-3 * 1.023, rel=0.01)
    assert downtime == pytest.approx(0.017, rel=0.05)
    assert MigrationPhase.COMMITTED.is_done


def test_neighbor_contention_slows_overlapping_steps_and_the_host_count_returns_to_zero():
    """A model with neighbor factors: instances stepping at once take longer, so the same
    trace decodes slower than with the factors at 1; after the run no step is counted."""
    from llumnix.sim.latency import NeighborContention

    base = fit_a10_llama7b()
    contended = dataclasses.replace(base, contention=NeighborContention(prefill=1.0, decode=1.5))
    neutral_model = dataclasses.replace(base, contention=NeighborContention(prefill=1.0, decode=1.0))
    outs = []
    for model in (base, contended, neutral_model):
        sim = Simulator(SMALL, model, StandInPolicy("round-robin"), _trace(n=60, rate=2.0))
        outs.append(sim.run())
        assert sim.cluster.host.num_stepping == 0
    plain, slow, neutral = outs
    assert plain["num_finished"] == slow["num_finished"] == 60 - plain["num_rejected"] > 50
    # at least most of the factor (slower steps also grow the batches, so it can be more)
    assert slow["decode"]["mean"] > 1.3 * plain["decode"]["mean"]
    # factors of 1 change nothing
    assert {k: neutral[k] for k in ("prefill", "decode", "e2e")} == {k: plain[k] for k in ("prefill", "decode", "e2e")}



def test_serving_overhead_lengthens_every_decode_step():
    """The same light trace with 10 ms of serving work per step: every first token and
    every later token waits for one more overhead at least (longer steps also grow the
    batches, so it can be more)."""
    base = fit_a10_llama7b()
    outs = [Simulator(SMALL, m, StandInPolicy("round-robin"), _trace(n=60, rate=1.0, kind="S-S")).run()
            for m in (base, dataclasses.replace(base, step_overhead_s=0.010))]
    plain, slow = outs
    assert plain["num_finished"] == slow["num_finished"] == 60
    assert plain["num_preemptions"] == slow["num_preemptions"] == 0
    assert slow["decode"]["mean"] >= plain["decode"]["mean"] + 0.0099
    assert slow["prefill"]["mean"] >= plain["prefill"]["mean"] + 0.0099


def test_kv_usage_is_the_time_weighted_share_of_blocks_in_use():
    """One request of 64 prompt tokens (4 blocks) and one output token: its prefill is
    the whole run and holds 4 of the instance's blocks, so usage is exactly 4 / M. A
    second instance doubles the provisioned blocks and halves it."""
    import numpy as np

    from llumnix.sim.workloads import Trace

    trace = Trace("one", 1.0, 0, np.zeros(1), np.array([64]), np.array([1]), np.zeros(1, dtype=np.int64))
    for n in (1, 2):
        cfg = dataclasses.replace(SMALL, num_instances=n)
        out = Simulator(cfg, fit_a10_llama7b(), StandInPolicy("round-robin"), trace).run()
        assert out["num_finished"] == 1
        assert out["sim"]["duration_s"] == pytest.approx(fit_a10_llama7b().prefill_time([64]))
        assert out["kv_usage_mean"] == pytest.approx(4 / (n * SMALL.num_blocks))


def test_a_removed_instance_still_counts_in_the_runs_steps_and_kv_usage():
    from llumnix.sim.cluster import Cluster
    from llumnix.sim.loop import EventLoop

    cluster = Cluster(SMALL, fit_a10_llama7b(), EventLoop().clock)
    a, b = cluster.new_instance(), cluster.new_instance()
    a.block_seconds, a.executor.num_steps = 5.0, 3
    b.block_seconds, b.executor.num_steps = 2.0, 4
    cluster.remove(a.instance_id)
    assert cluster.num_live == 1
    assert (cluster.block_seconds, cluster.num_steps) == (7.0, 7)


def test_chunked_prefill_runs_with_migration_and_cuts_decode_stalls():
    """The same trace with chunked prefill: every request finishes, migrations commit
    (requests mid-prefill included), the accounting stays exact, and the P99 decode
    latency per token falls: no decode waits out a whole long prefill."""
    policy = StandInPolicy("least-loaded", enable_migration=True, migrate_gap_blocks=20)
    plain = Simulator(SMALL, fit_a10_llama7b(), policy, _trace(kind="L-L", rate=1.0)).run()
    chunked_cfg = dataclasses.replace(SMALL, chunked_prefill=True, max_num_batched_tokens=512)
    sim = Simulator(chunked_cfg, fit_a10_llama7b(),
                    StandInPolicy("least-loaded", enable_migration=True, migrate_gap_blocks=20),
                    _trace(kind="L-L", rate=1.0))
    out = sim.run()
    assert out["num_finished"] == plain["num_finished"] > 140
    assert out["migrations"]["num_committed"] > 5
    assert out["decode"]["p99"] < plain["decode"]["p99"]
    for inst in sim.cluster.instances.values():
        inst.engine.check_invariants()
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
