"""`bench cluster --slo-classes` on a real 1-instance cluster: the classes reach the gateway
(its own `llumnix:slo_*` counts per class), and the run reports attainment per class."""
from __future__ import annotations

import json

import numpy as np
import pytest

from llumnix.cli import build_parser

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def test_a_real_run_reports_attainment_per_class(tmp_path, monkeypatch, capsys):
    from benchmarks.cluster.tiny_model import write_tiny_llama

    import llumnix.bench.cluster_bench as cb

    model = write_tiny_llama(tmp_path / "model", context=512)
    # a small fixed trace (not ShareGPT: the test needs no data set)
    monkeypatch.setattr(cb, "trace_pairs", lambda s: (np.array([6, 10, 14]), np.array([5, 8, 12])))
    classes = tmp_path / "classes.yaml"
    # one class no request can meet, one every finished request meets: attainment 0 and 1 exactly
    classes.write_text("never: {share: 0.4, ttft_s: 0.000001, tpot_s: 0.000001, priority: high}\n"
                       "always: {share: 0.6, ttft_s: 600, tpot_s: 60}\n")
    out = tmp_path / "out"
    args = build_parser().parse_args([
        "bench", "cluster", "--model", str(model), "--systems", "infaas++", "--instances", "1", "--seeds", "0",
        "--loads", "0.5", "--capacity", "4", "--burst-size", "0", "--requests-per-run", "10",
        "--slo-classes", str(classes), "--out", str(out)])
    assert cb.main_cluster_bench(args) == 0
    printed = capsys.readouterr().out
    assert "never 0/4 met, always 6/6 met" in printed  # the run's line
    data = json.loads((out / "cluster.json").read_text())
    run = data["systems"][0]["runs"][0]
    assert run["num_ok"] == 10
    by = run["by_slo_class"]
    assert (by["never"]["attainment"], by["always"]["attainment"]) == (0.0, 1.0)
    # the shedding measure read the run's gateway log: every "never" request missed its TTFT
    shed = run["shed_goal"]
    assert (shed["tight"], shed["loose"], shed["num_missed_ttft"]) == ("never", "always", 4)
    assert {c: x["num_requests"] for c, x in shed["classes"].items()} == {"never": 4, "always": 6}
    assert shed["num_unknown_instance"] == 0  # one instance: no migration
    # the gateway saw each request's class (the body's slo_class) and judged it the same
    assert (by["never"]["gateway_requests"], by["always"]["gateway_requests"]) == (4, 6)
    assert (by["never"]["gateway_met"], by["always"]["gateway_met"]) == (0, 6)
    summary = data["slo_classes"]["by_load"]["0.5"]["infaas++"]
    assert summary["always"]["attainment"]["median"] == 1.0 and summary["never"]["goodput_req_s"]["max"] == 0.0
    rows = [line.split() for line in printed.splitlines()]
    assert ["infaas++", "0.5", "never", "0.000", "(0.00-0.00)", "0.000"] in rows  # the per-class table
