"""The simulator driving the shared policy objects (GlobalScheduler, Llumlets)."""
from __future__ import annotations

import json

from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import SystemSpec
from llumnix.sim.latency import fit_a10_llama7b
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.runner import main_simulate
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import TraceSpec, make_trace

TINY = ClusterConfig(num_instances=3, num_blocks=500, max_model_len=8000)


def _run(name: str, migration: bool):
    spec = SystemSpec(name, name, migration, {"migrate_out_threshold": 3} if migration else {})
    sim = Simulator(TINY, fit_a10_llama7b(), make_policy(spec, TINY),
                    make_trace(TraceSpec("L-L", "L-L", num_requests=200), 0.5, 0))
    return sim, sim.run()


def test_llumnix_beats_round_robin_on_p99_prefill_in_a_tiny_cluster():
    _, rr = _run("round-robin", False)
    sim, ll = _run("llumnix", True)
    assert ll["num_finished"] == rr["num_finished"] == 200
    assert ll["migrations"]["num_committed"] > 0
    assert ll["prefill"]["p99"] * 5 < rr["prefill"]["p99"]
    assert ll["preemption_loss"]["mean"] <= rr["preemption_loss"]["mean"]
    for inst in sim.cluster.instances.values():
        inst.engine.check_invariants()
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
        assert not inst.llumlet.migrating_out


def test_simulate_command_writes_metrics_and_plots(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("""
name: t
num_requests: 40
cluster: {num_instances: 2}
systems:
  rr: {dispatch: round-robin}
  llumnix: {dispatch: llumnix, migration: true}
traces:
  - {name: S-S, kind: S-S, rates: [2.0, 3.0]}
""")
    out = tmp_path / "out"
    assert main_simulate(str(cfg), ["cluster.num_instances=3"], 1, str(out)) == 0
    doc = json.loads((out / "metrics.json").read_text())
    recs = doc["records"]
    assert len(recs) == 4 and {r["system"] for r in recs} == {"rr", "llumnix"}
    for r in recs:
        assert r["num_finished"] == 40 and r["num_instances"] == 3
        for key in ("prefill", "decode", "e2e", "preemption_loss"):
            assert set(r[key]) >= {"mean", "p50", "p99"}
        assert r["sim"]["events_per_s"] > 0 and "downtime" in r["migrations"]
    assert (out / "latency_vs_rate_s-s.png").stat().st_size > 0
    assert (out / "cdf_s-s.png").stat().st_size > 0
