"""The serving metrics PD is judged by: inter-token gaps, SLO attainment, goodput over a
rate sweep; and the experiment config's slo and pd keys."""
from __future__ import annotations

import math

import pytest

from llumnix.core.batch import RequestMetrics, RequestOutput
from llumnix.sim.config import ConfigError, parse_config
from llumnix.sim.metrics import SLO, MetricsCollector, goodput, slo_attainment


def _req(ttft: float, tpot: float | None, n_out: int = 11) -> RequestMetrics:
    n = n_out if tpot is not None else 1
    finish = ttft + (tpot or 0.0) * (n - 1)
    return RequestMetrics(0.0, 0.0, ttft, finish, 10, n, 0, 0.0, 0)


def test_slo_attainment_needs_both_objectives_and_a_one_token_request_only_ttft():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    reqs = [_req(0.5, 0.05), _req(1.5, 0.05), _req(0.5, 0.2), _req(0.9, None)]
    assert slo_attainment(reqs, slo) == pytest.approx(2 / 4)
    assert math.isnan(slo_attainment([], slo))


@pytest.mark.parametrize(("points", "highest", "interpolated"), [
    ([(4, 1.0), (8, 0.95), (12, 0.7)], 8, 8 + 4 * (0.95 - 0.9) / (0.95 - 0.7)),
    ([(4, 1.0), (8, 0.95)], 8, 8),                    # passes at the top rate
    ([(4, 0.5), (8, 0.95)], 0, 4 * 0.1 / 0.5),        # the lowest fails: crossing from (0, 1.0)
    ([(8, 0.8), (4, 0.95), (12, 0.99)], 4, 4 + 4 * 0.05 / 0.15),  # not monotone: the first failure counts
])
def test_goodput_is_the_highest_rate_up_to_the_first_failure(points, highest, interpolated):
    g = goodput(points)
    assert g["highest"] == highest and g["interpolated"] == pytest.approx(interpolated)


def test_inter_token_gaps_span_steps_and_end_with_the_request():
    m = MetricsCollector()
    m.on_outputs([RequestOutput("a", [1], 1)], 1.0)
    m.on_outputs([RequestOutput("a", [1], 2), RequestOutput("b", [1], 1)], 1.5)
    m.on_outputs([RequestOutput("a", [], 2)], 1.7)  # no token: no gap
    m.on_outputs([RequestOutput("a", [1], 3, finish_reason="length"), RequestOutput("b", [1], 2)], 2.5)
    assert list(m.token_gaps) == [0.5, 1.0, 1.0]
    assert "a" not in m._last_token


def _doc(**extra):
    return {"systems": {"pd": {"dispatch": "llumnix", "migration": True, "pd": {"mode": "static"}}},
            "traces": [{"kind": "S-S", "rates": [1]}], "cluster": {"num_instances": 4}, **extra}


def test_experiment_slo_and_pd_keys():
    cfg = parse_config(_doc(slo={"ttft_s": 1, "tpot_s": 0.05}))
    assert cfg.slo == SLO(1.0, 0.05) and cfg.systems[0].options["pd"] == {"mode": "static"}
    with pytest.raises(ConfigError, match=r"^slo\.tpot_s must be a positive number"):
        parse_config(_doc(slo={"ttft_s": 1, "tpot_s": 0}))
    bad = _doc()
    bad["systems"]["pd"]["pd"] = {"mode": "static", "prefill_instances": 4}
    with pytest.raises(ConfigError, match=r"^systems\.pd\.pd\.prefill_instances: must be between 1 and 3"):
        parse_config(bad)
    bad["systems"]["pd"]["pd"] = {"mode": "spread"}
    with pytest.raises(ConfigError, match=r"^systems\.pd\.pd\.mode: must be one of off, static, adaptive"):
        parse_config(bad)
