"""The slo policy in the simulator: attainment per SLO class in every record, the
predictor seeded from the run's latency model, shedding counted as misses, determinism."""
from __future__ import annotations

from collections import Counter

from llumnix.policy.predictor import StepTimeModel
from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import SystemSpec
from llumnix.sim.latency import a10_llama7b_serving
from llumnix.sim.runner import RunSpec, run_one
from llumnix.sim.workloads import TraceSpec

CLUSTER = ClusterConfig(num_instances=2, num_blocks=120, max_model_len=4096)
TRACE = TraceSpec("small", "S-S", num_requests=160, cv=4.0, high_priority_fraction=0.3)


def _run(system: SystemSpec, rate: float = 12.0, seed: int = 0) -> dict:
    return run_one(RunSpec(system, TRACE, rate, seed, CLUSTER, "a10-llama7b-serving"))


def _slo(**options) -> SystemSpec:
    return SystemSpec("slo", "slo", enable_migration=True, options=options)


def test_every_record_reports_attainment_per_class() -> None:
    for system in (SystemSpec("infaas++", "infaas++"), _slo()):
        r = _run(system)
        classes = r["by_slo_class"]
        assert set(classes) == {"interactive", "batch"}
        n = classes["interactive"]["num_finished"] + classes["batch"]["num_finished"]
        assert n == r["num_finished"] and n + r["num_rejected"] == 160  # rejected: longer than the model
        assert classes["interactive"]["ttft_s"] == 1.0 and classes["batch"]["tpot_s"] == 0.3
        for c in classes.values():
            assert 0.0 <= c["attainment"] <= 1.0 and c["meets"] == (c["attainment"] >= 0.9)


def test_slo_runs_are_deterministic() -> None:
    a, b = _run(_slo()), _run(_slo())
    assert a["by_slo_class"] == b["by_slo_class"] and a["migrations"] == b["migrations"]


def test_predictor_is_seeded_from_the_run_latency_model() -> None:
    from llumnix.sim.policy_bridge import make_policy

    policy = make_policy(_slo(), CLUSTER)
    assert policy.gs.slo is not None
    policy.seed_predictor(a10_llama7b_serving())
    assert policy.gs.slo.steps.coef == StepTimeModel.from_latency(a10_llama7b_serving()).coef


def test_shed_requests_count_as_misses_of_their_class() -> None:
    shedding = {"classes": {"interactive": {"ttft_s": 0.05, "tpot_s": 0.1, "priority": "high", "shed_share": 0.5},
                            "batch": {"ttft_s": 10, "tpot_s": 0.3}}}
    r = _run(_slo(slo=shedding), rate=40.0)
    inter = r["by_slo_class"]["interactive"]
    assert inter["num_shed"] > 0 and r["by_slo_class"]["batch"]["num_shed"] == 0
    n = inter["num_finished"] + inter["num_shed"] + r["by_slo_class"]["batch"]["num_finished"]
    assert n + r["num_rejected"] == 160
    assert inter["attainment"] <= inter["num_finished"] / (inter["num_finished"] + inter["num_shed"])


def test_slo_records_carry_the_predictor_ttft_error() -> None:
    r = _run(_slo())
    err = r["slo_predictor"]
    assert err["num"] == r["num_finished"]  # every finished request was predicted at dispatch
    assert 0.0 <= err["ttft_rel_error_p50"] <= err["ttft_rel_error_p90"]
    assert "slo_predictor" not in _run(SystemSpec("infaas++", "infaas++"))


def test_ttft_errors_match_predictions_to_requests_by_id() -> None:
    from llumnix.core.batch import RequestMetrics
    from llumnix.sim.runner import ttft_errors

    def req(arrival: float, ttft: float) -> RequestMetrics:
        return RequestMetrics(arrival, arrival, arrival + ttft, arrival + 1, 10, 5, 0, 0.0, 0)

    predicted = {"a": (0.0, 1.5), "b": (1.0, 0.5), "c": (2.0, 9.0), "d": (1.0, 4.0)}  # c never finished
    out = ttft_errors(predicted, [req(0.0, 1.0), req(1.0, 1.0), req(1.0, 4.0)], ["a", "b", "d"])
    # b and d arrived together: each is compared with its own TTFT (by arrival, both were with d's)
    assert out == {"num": 3, "ttft_rel_error_p50": 0.5, "ttft_rel_error_p90": 0.5, "ttft_signed_p50": 0.0}


def test_only_the_slo_policy_engines_serve_overdue_requests_last() -> None:
    from llumnix.sim.runner import make_simulator

    def overdue(system: SystemSpec) -> int:
        sim = make_simulator(RunSpec(system, TRACE, 40.0, 0, CLUSTER, "a10-llama7b-serving"))
        sim.run()
        return sum(i.engine.scheduler.num_overdue for i in sim.cluster.instances.values())

    assert overdue(_slo()) > 0  # 40 req/s on two instances: queues wait past 10 s
    assert overdue(_slo(slo={"engine_order": "fcfs"})) == 0
    assert overdue(SystemSpec("llumnix", "llumnix", enable_migration=True)) == 0


SAME_PRIORITY = {"classes": {"chat": {"ttft_s": 1.0, "tpot_s": 0.1}, "jobs": {"ttft_s": 10.0, "tpot_s": 0.3}},
                 "default_class": "jobs"}
"""Two classes at one priority (normal): only their names tell them apart."""
NAMED = TraceSpec("named", "S-S", num_requests=160, cv=4.0, slo_classes=(("chat", 0.3), ("jobs", 0.7)))


def test_two_classes_at_one_priority_get_attainment_each_by_the_name_the_trace_gives() -> None:
    from llumnix.sim.runner import make_simulator
    from llumnix.sim.workloads import make_trace

    trace = make_trace(NAMED, 12.0, 0)
    assert trace.slo_class_ids is not None
    names = [trace.slo_class_names[k] for k in trace.slo_class_ids.tolist()]
    assert 30 <= names.count("chat") <= 70  # 30% of 160 drawn
    for system in (SystemSpec("infaas++", "infaas++", options={"slo": SAME_PRIORITY}), _slo(slo=SAME_PRIORITY)):
        sim = make_simulator(RunSpec(system, NAMED, 12.0, 0, CLUSTER, "a10-llama7b-serving"))
        r = sim.run()
        assert set(r["by_priority"]) == {"normal"}  # one priority, two classes
        assert sim.trace.priorities.tolist() == [0] * 160
        got = r["by_slo_class"]
        assert set(got) == {"chat", "jobs"}
        assert got["chat"]["num_finished"] + got["jobs"]["num_finished"] == r["num_finished"]
        # each finished request is judged by the objectives of the class it named
        fin, total = Counter(sim.metrics.slo_names), Counter(names)
        assert all(fin[n] <= total[n] for n in total) and total.total() - fin.total() == r["num_rejected"]
        for name, (ttft, tpot) in {"chat": (1.0, 0.1), "jobs": (10.0, 0.3)}.items():
            mine = [m for m, n in zip(sim.metrics.requests, sim.metrics.slo_names, strict=True) if n == name]
            met = sum(m.ttft is not None and m.ttft <= ttft and (m.decode_per_token is None or m.decode_per_token <= tpot)
                      for m in mine)
            assert got[name]["num_finished"] == len(mine) and got[name]["attainment"] == met / len(mine)


def test_the_slo_policys_engines_order_each_request_by_the_class_it_named(monkeypatch) -> None:
    from llumnix.engine.engine_core import EngineCore
    from llumnix.sim.runner import make_simulator

    sim = make_simulator(RunSpec(_slo(slo=SAME_PRIORITY), NAMED, 12.0, 0, CLUSTER, "a10-llama7b-serving"))
    seen: dict[str, str] = {}
    add = EngineCore.add_request

    def record(self, *a, **kw):
        req = add(self, *a, **kw)
        seen[req.request_id] = req.slo_class
        return req

    monkeypatch.setattr(EngineCore, "add_request", record)
    r = sim.run()
    trace = sim.trace
    assert trace.slo_class_ids is not None
    named = {f"req-{i}": trace.slo_class_names[k] for i, k in enumerate(trace.slo_class_ids.tolist())}
    assert len(seen) == 160 - r["num_rejected"] and seen == {k: named[k] for k in seen}
    assert all(i.engine.scheduler.objectives is not None for i in sim.cluster.instances.values())


def test_a_class_the_trace_names_and_the_system_lacks_is_one_line() -> None:
    import pytest

    from llumnix.sim.runner import make_simulator
    from llumnix.sim.workloads import TraceError

    bad = TraceSpec("bad", "S-S", num_requests=10, slo_classes=(("chat", 0.5), ("nope", 0.5)))
    with pytest.raises(TraceError) as e:
        make_simulator(RunSpec(_slo(slo=SAME_PRIORITY), bad, 4.0, 0, CLUSTER, "a10-llama7b-serving"))
    assert str(e.value) == "trace 'bad' names slo class 'nope', which scheduling.slo does not define (known: chat, jobs)"


def test_a_trace_of_named_classes_is_checked() -> None:
    import pytest

    from llumnix.sim.workloads import TraceError

    with pytest.raises(TraceError, match="add up to 1"):
        TraceSpec("x", "S-S", slo_classes=(("a", 0.5), ("b", 0.2)))
    with pytest.raises(TraceError, match="exclusive"):
        TraceSpec("x", "S-S", high_priority_fraction=0.3, slo_classes=(("a", 1.0),))


def test_a_rescue_moves_the_request_it_names_and_no_chain_follows(monkeypatch) -> None:
    from llumnix.sim.runner import make_simulator

    # the freeness rule would keep every pair going (every source stays a source, every
    # destination one): a rescue's chain must end anyway (policy.rounds.keep_migrating)
    monkeypatch.setattr("llumnix.policy.rounds.is_source", lambda *a: True)
    monkeypatch.setattr("llumnix.policy.rounds.is_destination", lambda *a: True)
    sim = make_simulator(RunSpec(_slo(slo={"rescue": True}), TRACE, 24.0, 0, CLUSTER, "a10-llama7b-serving"))
    bridge = sim.policy
    select, keep = bridge.select_request, bridge.keep_migrating
    last_named: dict[tuple[str, str], bool] = {}
    after_named: list[bool] = []

    def spy_select(src, dst):
        pair = (src.instance_id, dst.instance_id)
        named = bridge._named.get(pair)
        rid = select(src, dst)
        last_named[pair] = rid is not None and rid == named
        return rid

    def spy_keep(src, dst):
        going = keep(src, dst)
        if last_named.get((src.instance_id, dst.instance_id)):
            after_named.append(going)
        return going

    bridge.select_request, bridge.keep_migrating = spy_select, spy_keep
    sim.run()
    assert after_named, "the run should rescue some request"
    assert not any(after_named)  # each rescue's chain ends with the request it named


def test_rescue_is_opt_in() -> None:
    from llumnix.policy.slo import SLOConfig

    assert SLOConfig().rescue is False


def test_simulate_names_an_unknown_class_in_one_line(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("""
name: bad
num_requests: 10
plots: false
cluster: {num_instances: 1, num_blocks: 120, max_model_len: 4096}
systems:
  slo: {dispatch: slo, slo: {classes: {chat: {ttft_s: 1, tpot_s: 0.1}, jobs: {ttft_s: 10, tpot_s: 0.3}},
                             default_class: jobs}}
traces:
  - {name: two, kind: S-S, rates: [4], slo_classes: {chat: 0.5, nope: 0.5}}
""")
    r = subprocess.run([sys.executable, "-m", "llumnix.cli", "simulate", str(cfg), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(src)})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines == ["llumnix simulate: error: trace 'two' names slo class 'nope', which scheduling.slo does not "
                     "define (known: chat, jobs)"], r.stderr
