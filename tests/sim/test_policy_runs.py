"""The simulator driving the shared policy objects (GlobalScheduler, Llumlets)."""
from __future__ import annotations

import json

from llumnix.policy.freeness import room_for_queued
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


def test_queued_moves_fits_sends_queued_requests_only_where_they_start():
    spec = SystemSpec("llumnix", "llumnix", True,
                      {"migrate_out_threshold": 10, "rescheduling": {"queued_moves": "fits"}})
    policy = make_policy(spec, TINY)
    picks = []
    select = policy.select_request

    def spy(src, dst):
        rid = select(src, dst)
        queued = {r.request_id: r.num_tokens for r in src.llumlet.report(0.0).waiting}
        if rid in queued:
            picks.append((-(-queued[rid] // TINY.block_size), room_for_queued(dst.llumlet.report(0.0))))
        return rid

    policy.select_request = spy
    sim = Simulator(TINY, fit_a10_llama7b(), policy, make_trace(TraceSpec("S-L", "S-L", num_requests=300), 1.2, 0))
    out = sim.run()
    assert out["num_finished"] == 300 and out["migrations"]["num_committed"] > 0
    assert picks, "the run should move some queued requests"
    assert all(need <= room for need, room in picks)
    for inst in sim.cluster.instances.values():
        inst.engine.check_invariants()
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks


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


def test_resume_keeps_finished_runs_and_runs_only_the_missing_ones(tmp_path, monkeypatch):
    import llumnix.sim.runner as runner

    cfg = tmp_path / "exp.yaml"
    cfg.write_text("""
name: t
num_requests: 30
plots: false
cluster: {num_instances: 2}
systems:
  rr: {dispatch: round-robin}
traces:
  - {name: S-S, kind: S-S, rates: [2.0]}
""")
    out = tmp_path / "out"
    assert main_simulate(str(cfg), [], 1, str(out)) == 0
    first = json.loads((out / "metrics.json").read_text())["records"]
    ran = []
    real = runner.run_one
    monkeypatch.setattr(runner, "run_one", lambda spec, progress=None: ran.append(spec.seed) or real(spec, progress))
    assert main_simulate(str(cfg), [], 2, str(out), resume=True) == 0
    recs = json.loads((out / "metrics.json").read_text())["records"]
    assert ran == [1]                                   # seed 0 was kept, not rerun
    assert [r["seed"] for r in recs] == [0, 1] and recs[0] == first[0]
    fresh = tmp_path / "fresh"
    assert main_simulate(str(cfg), [], 2, str(fresh)) == 0  # resumed = run in one go
    again = json.loads((fresh / "metrics.json").read_text())["records"]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "sim"} for r in rs]  # noqa: E731 - wall time differs
    assert strip(again) == strip(recs)


def test_auto_scaling_adds_instances_under_load_and_drains_them_after():
    cfg = ClusterConfig(num_instances=1, num_blocks=400, max_model_len=6000, instance_startup_s=5.0)
    spec = SystemSpec("llumnix", "llumnix", True, {
        "scaling": {"enabled": True, "scale_out_below": 10, "scale_in_above": 60, "window_s": 2.0,
                    "cooldown_s": 4.0, "min_instances": 1, "max_instances": 4}})
    trace = make_trace(TraceSpec("M-M", "M-M", num_requests=250), 1.5, 0)
    policy = make_policy(spec, cfg)
    decisions = []
    scale = policy.scale
    policy.scale = lambda n: (decisions.append((n, d := scale(n))), d)[1]
    sim = Simulator(cfg, fit_a10_llama7b(), policy, trace)
    out = sim.run()
    assert out["num_finished"] + out["num_rejected"] == 250
    outs = [n for n, (kind, _) in decisions if kind == "out"]
    assert outs and max(outs) < 4  # never past max_instances, counting those still starting
    counts = [n for _, n in sim.metrics.instance_timeline]  # draining instances count: they cost
    assert max(counts) > 1 and 1 < out["instances"]["average"] < 4
    assert any(b < a for a, b in zip(counts, counts[1:], strict=False))  # it also scaled in
    for inst in sim.cluster.instances.values():
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks


def test_same_seed_same_metrics_with_the_real_policies():
    def once():
        spec = SystemSpec("llumnix", "llumnix", True, {"migrate_out_threshold": 3})
        sim = Simulator(TINY, fit_a10_llama7b(), make_policy(spec, TINY),
                        make_trace(TraceSpec("L-L", "L-L", num_requests=60), 0.5, 7))
        out = sim.run()
        out.pop("sim")
        return json.dumps(out, sort_keys=True)

    assert once() == once()


def test_shared_prefixes_hit_the_cache_and_prefix_affinity_finds_them():
    """A trace whose prompts start with one of 12 shared 512-token prefixes (32 blocks) on
    3 instances of 300 blocks, which cannot all cache all 12: with the cache every system
    reuses prompt blocks, prefix affinity far more, and the cheaper cached prefills make
    its prefills shorter; every block comes back in the end."""
    cluster = ClusterConfig(num_instances=3, num_blocks=300, max_model_len=8000, enable_prefix_caching=True)
    trace = make_trace(TraceSpec("docs", "S-S", num_requests=300, prefix_groups=12, prefix_tokens=512), 2.0, 0)
    assert len(trace.prompt_token_ids(0)) == int(trace.prompt_lens[0]) > 512
    assert trace.prompt_token_ids(0)[:512] == [1 + int(trace.prefix_ids[0])] * 512
    results = {}
    for name, params in (("llumnix", {}), ("llumnix-prefix", {"prefix": True})):
        spec = SystemSpec(name, "llumnix", True, {"migrate_out_threshold": 3, "dispatch_params": params})
        sim = Simulator(cluster, fit_a10_llama7b(), make_policy(spec, cluster), trace)
        results[name] = sim.run()
        for inst in sim.cluster.instances.values():
            inst.engine.check_invariants()
            assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
    plain, affine = results["llumnix"], results["llumnix-prefix"]
    assert plain["num_finished"] + plain["num_rejected"] == affine["num_finished"] + affine["num_rejected"] == 300
    assert plain["num_rejected"] == affine["num_rejected"] < 10  # prompts too long for an instance
    hits = plain["prefix_cache"]["hit_rate"], affine["prefix_cache"]["hit_rate"]
    assert hits[0] > 0.3 and hits[1] > hits[0] + 0.2  # 0.42 and 0.75
    assert affine["prefill"]["mean"] < 0.7 * plain["prefill"]["mean"]  # 0.052 s against 0.095 s
