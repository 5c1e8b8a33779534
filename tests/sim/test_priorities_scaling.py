"""Priorities and auto-scaling in the simulator, driving the real policy objects:
priority-first dispatch and admission, headroom pushing normal requests away,
scale-out filled by migration, scale-in drained by migration, instance bounds."""
from __future__ import annotations

import numpy as np

from llumnix.policy.lifecycle import InstanceState
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import SystemSpec
from llumnix.sim.latency import fit_a10_llama7b
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import Trace, TraceSpec, make_trace

LATENCY = fit_a10_llama7b()


def _trace(arrivals, prompts, outputs, priorities) -> Trace:
    return Trace("hand", 1.0, 0, np.asarray(arrivals, dtype=float), np.asarray(prompts, dtype=np.int64),
                 np.asarray(outputs, dtype=np.int64), np.asarray(priorities, dtype=np.int64))


class Recording(Simulator):
    """Records the id of every finished request (the simulator asks each one's class)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.finished_ids: list[str] = []

    def _trace_class(self, request_id: str) -> int:
        self.finished_ids.append(request_id)
        return super()._trace_class(request_id)


def _scaling(**kw) -> dict:
    return {"enabled": True, "window_s": 0.5, "cooldown_s": 0.5, **kw}


# -- priorities ----------------------------------------------------------------------------
def test_gateway_dispatches_high_priority_first_fcfs_within_a_priority():
    """No instance takes requests until t=1: the gateway queue is then drained high first."""
    prios = [0, 1, 0, 0, 1, 0, 1, 0]
    trace = _trace([0.1 * i for i in range(8)], [32] * 8, [4] * 8, prios)
    cfg = ClusterConfig(num_instances=2, num_blocks=200, max_model_len=2048)

    def order(priorities: bool) -> list[int]:
        policy = make_policy(SystemSpec("llumnix", "llumnix"), cfg)
        sent: list[int] = []
        dispatch = policy.dispatch

        def closed_until_1s(rid, n, t, p, tokens=None, slo_class=None):
            if policy.clock.now() < 1.0:
                return None
            sent.append(int(rid.split("-")[1]))
            return dispatch(rid, n, t, p, tokens, slo_class)

        policy.dispatch = closed_until_1s
        out = Simulator(cfg, LATENCY, policy, trace, priorities=priorities).run()
        assert out["num_finished"] == 8
        return sent

    assert order(True) == [1, 4, 6, 0, 2, 3, 5, 7]
    assert order(False) == list(range(8))


def test_engine_admits_high_priority_first_and_metrics_split_by_class():
    """One instance whose prefill batch holds one prompt: a burst is admitted high first."""
    prios = [0, 0, 1, 0, 1, 0, 0, 1, 0, 0]
    trace = _trace([0.001 * i for i in range(10)], [500] * 10, [8] * 10, prios)
    cfg = ClusterConfig(num_instances=1, num_blocks=400, max_num_batched_tokens=512, max_model_len=2048)

    def classes_by_first_token(priorities: bool) -> tuple[list[int], dict]:
        sim = Simulator(cfg, LATENCY, make_policy(SystemSpec("llumnix", "llumnix"), cfg), trace,
                        priorities=priorities)
        out = sim.run()
        ms = sim.metrics
        order = sorted(range(len(ms.requests)), key=lambda k: ms.requests[k].first_token_time)
        return [ms.classes[k] for k in order], out

    classes, out = classes_by_first_token(True)
    assert classes == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # req-0 was alone when it started
    by = out["by_priority"]
    assert by["high"]["num_finished"] == 3 and by["normal"]["num_finished"] == 7
    assert by["high"]["prefill"]["mean"] < by["normal"]["prefill"]["mean"]
    classes, out = classes_by_first_token(False)
    assert classes == prios  # FCFS; the trace's classes are still reported
    assert out["by_priority"]["high"]["num_finished"] == 3


def test_headroom_makes_normal_requests_migrate_away_from_a_high_priority_one():
    # Round-robin dispatch: req-0 (high) -> instance-0, then normals alternate, 3 each.
    prios = [1, 0, 0, 0, 0, 0, 0]
    # The high-priority request outlives the others: while it runs, its headroom holds.
    trace = _trace([0.001 * i for i in range(7)], [64] * 7, [400] + [200] * 6, prios)
    cfg = ClusterConfig(num_instances=2, num_blocks=200, max_model_len=2048, check_invariants=True)

    def run(headroom: int):
        # in 40 > out 25: hysteresis, so a moved request does not bounce back as blocks grow
        spec = SystemSpec("rr-migrate", "round-robin", True, {
            "migrate_out_threshold": 25, "rescheduling": {"in_threshold": 40},
            "freeness": {"headroom_tokens": {"high": headroom}}})
        sim = Simulator(cfg, LATENCY, make_policy(spec, cfg), trace)
        out = sim.run()
        assert out["num_finished"] == 7
        return [m for m in sim.metrics.migrations if m.committed]

    moved = run(1600)  # 100 blocks of headroom: instance-0's freeness (200-116)/4 = 21 < 25
    away = [m for m in moved if m.src_instance_id == "instance-0"]
    assert len(away) >= 2 and moved[0] is away[0] and away[0].start_time < 0.2  # the first round
    assert all(m.request_id != "req-0" for m in moved)  # the high-priority request stays put
    assert run(0) == []  # the same requests without headroom: (200-16)/4 = 46, nothing moves


# -- auto-scaling --------------------------------------------------------------------------
def test_scale_out_instance_is_filled_by_migration():
    # A burst on one small instance; no arrival after t=0.1, so whatever the new
    # instance serves reached it by migration.
    trace = _trace([0.005 * i for i in range(20)], [400] * 20, [400] * 20, [0] * 20)
    cfg = ClusterConfig(num_instances=1, num_blocks=300, max_model_len=2048, instance_startup_s=1.0,
                        check_invariants=True)
    spec = SystemSpec("llumnix", "llumnix", True, {"migrate_out_threshold": 3,
                                                  "scaling": _scaling(max_instances=2, scale_in_above=1e9)})
    policy = make_policy(spec, cfg)
    ups: list[float] = []  # when an instance joined after the start
    add_instance = policy.add_instance
    policy.add_instance = lambda inst: (inst.instance_id != "instance-0" and ups.append(policy.clock.now()),
                                        add_instance(inst))[1]
    sim = Recording(cfg, LATENCY, policy, trace)
    out = sim.run()
    assert sorted(sim.finished_ids) == sorted(f"req-{i}" for i in range(20))
    assert len(ups) == 1 and ups[0] > 0.5
    into_new = [m for m in sim.metrics.migrations if m.committed and m.dst_instance_id == "instance-1"]
    assert len(into_new) >= 3
    assert min(m.start_time for m in into_new) < ups[0] + 0.2  # at once, not when load happens to shift
    assert out["instances"]["max"] == 2 and 1 < out["instances"]["average"] < 2


def test_scale_in_drains_by_migration_and_loses_no_request():
    trace = make_trace(TraceSpec("L-L", "L-L", num_requests=40), 1.0, 3)
    cfg = ClusterConfig(num_instances=3, num_blocks=400, max_model_len=6144, check_invariants=True)
    spec = SystemSpec("llumnix", "llumnix", True, {"migrate_out_threshold": 3,
                                                  "scaling": _scaling(min_instances=1, window_s=2.0)})
    policy = make_policy(spec, cfg)
    held_at_marking: dict[str, int] = {}  # victim -> requests it held when marked terminating
    on_terminating = policy.on_terminating
    policy.on_terminating = lambda inst: (held_at_marking.setdefault(inst.instance_id, len(inst.engine.requests)),
                                          on_terminating(inst))[1]
    sim = Recording(cfg, LATENCY, policy, trace)
    out = sim.run()
    # every request completes exactly once, none rejected, block accounting exact
    assert out["num_rejected"] == 0
    assert sorted(sim.finished_ids) == sorted(f"req-{i}" for i in range(40))
    for inst in sim.cluster.instances.values():
        inst.engine.check_invariants()
        assert inst.engine.kv.num_free_blocks == inst.engine.kv.num_total_blocks
    busy = {iid for iid, n in held_at_marking.items() if n > 0}
    assert busy  # a victim that held requests...
    drained = [m for m in sim.metrics.migrations if m.committed and m.src_instance_id in busy]
    assert drained  # ...was drained by migration, and retired
    assert not busy & set(sim.cluster.instances)
    counts = [n for _, n in sim.metrics.instance_timeline]
    assert counts[0] == 3 and min(counts) >= 1 and counts[-1] < 3


def test_min_and_max_instances_bound_scaling():
    trace = make_trace(TraceSpec("S-S", "S-S", num_requests=80), 4.0, 0)
    cfg = ClusterConfig(num_instances=3, num_blocks=300, max_model_len=6144, instance_startup_s=0.3)

    def run(scaling: dict) -> list[int]:
        spec = SystemSpec("llumnix", "llumnix", True, {"scaling": _scaling(**scaling)})
        sim = Recording(cfg, LATENCY, make_policy(spec, cfg), trace)
        out = sim.run()
        assert sorted(sim.finished_ids) == sorted(f"req-{i}" for i in range(80))
        assert out["num_rejected"] == 0
        return [n for _, n in sim.metrics.instance_timeline]

    # Always below the scale-out mark: grows to max_instances, never past it.
    grow = run({"scale_out_below": 1e9, "scale_in_above": 2e9, "max_instances": 5})
    assert max(grow) == 5
    # Always above the scale-in mark: shrinks to min_instances, never below.
    shrink = run({"scale_out_below": -2e9, "scale_in_above": -1e9, "min_instances": 2})
    assert shrink[-1] == 2 and min(shrink) == 2


def test_retiring_while_a_migration_of_the_finished_last_request_is_in_flight():
    """The draining instance's last request finishes mid-copy (marked at 0.7 s, after its
    prefill; the first stage copies 188 blocks, ~0.1 s): the instance retires once,
    the in-flight run aborts and the destination's reservation is freed."""
    trace = _trace([0.0], [3000], [4], [0])  # prefill ~0.66 s, then 3 decode steps (~0.1 s)
    cfg = ClusterConfig(num_instances=2, num_blocks=400, max_model_len=4096, check_invariants=True)
    spec = SystemSpec("llumnix", "llumnix", True, {"migrate_out_threshold": 3})

    class DrainAt(Recording):
        def on_status_round(self, ev):
            inst = self.cluster.instances.get("instance-0")
            if inst is not None and not inst.is_terminating and self.clock.now() >= 0.68:
                inst.move(InstanceState.TERMINATING)  # what on_scaling does to a victim
                self.policy.on_terminating(inst)
                self._report(inst)
            return super().on_status_round(ev)

    sim = DrainAt(cfg, LATENCY, make_policy(spec, cfg), trace)
    out = sim.run()
    assert sim.finished_ids == ["req-0"]
    [run] = sim.metrics.migrations
    assert not run.committed and run.src_instance_id == "instance-0"
    assert list(sim.cluster.instances) == ["instance-1"]
    dst = sim.cluster.instances["instance-1"]
    dst.engine.check_invariants()
    assert dst.engine.kv.num_free_blocks == dst.engine.kv.num_total_blocks and not dst.migrations_in
    assert [n for _, n in sim.metrics.instance_timeline] == [2, 1] and out["num_finished"] == 1


def test_config_priorities_flag_and_anchor_keys():
    import pytest

    from llumnix.sim.config import ConfigError, parse_config

    doc = {"x-sys": {"dispatch": "llumnix"}, "traces": [{"kind": "S-S", "rates": [1.0], "cv": 2,
                                                          "high_priority_fraction": 0.1}],
           "systems": {"on": {"dispatch": "llumnix"}, "off": {"dispatch": "llumnix", "priorities": False}}}
    cfg = parse_config(doc)
    assert [s.priorities for s in cfg.systems] == [True, False]
    assert cfg.traces[0].spec.high_priority_fraction == 0.1
    doc["systems"]["off"]["priorities"] = "no"
    with pytest.raises(ConfigError, match="priorities must be true or false"):
        parse_config(doc)
