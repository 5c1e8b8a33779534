"""The slo policy in the simulator: attainment per SLO class in every record, the
predictor seeded from the run's latency model, shedding counted as misses, determinism."""
from __future__ import annotations

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


def test_ttft_errors_match_predictions_to_requests_by_arrival() -> None:
    from llumnix.core.batch import RequestMetrics
    from llumnix.sim.runner import ttft_errors

    def req(arrival: float, ttft: float) -> RequestMetrics:
        return RequestMetrics(arrival, arrival, arrival + ttft, arrival + 1, 10, 5, 0, 0.0, 0)

    out = ttft_errors([(0.0, 1.5), (1.0, 0.5), (2.0, 9.0)], [req(0.0, 1.0), req(1.0, 1.0)])  # 2.0 never finished
    assert out == {"num": 2, "ttft_rel_error_p50": 0.5, "ttft_rel_error_p90": 0.5, "ttft_signed_p50": 0.0}


def test_only_the_slo_policy_engines_serve_overdue_requests_last() -> None:
    from llumnix.sim.runner import make_simulator

    def overdue(system: SystemSpec) -> int:
        sim = make_simulator(RunSpec(system, TRACE, 40.0, 0, CLUSTER, "a10-llama7b-serving"))
        sim.run()
        return sum(i.engine.scheduler.num_overdue for i in sim.cluster.instances.values())

    assert overdue(_slo()) > 0  # 40 req/s on two instances: queues wait past 10 s
    assert overdue(_slo(slo={"engine_order": "fcfs"})) == 0
    assert overdue(SystemSpec("llumnix", "llumnix", enable_migration=True)) == 0
