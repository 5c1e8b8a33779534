"""bench cluster's prediction in the simulator (issue 45): the simulator gets the very trace
the cluster is sent, and the comparison's statistics are the paired ones."""
from __future__ import annotations

import numpy as np
import pytest

from llumnix.bench.cluster_bench import ClusterBenchSettings, make_requests, trace_pairs
from llumnix.bench.sim_vs_real import InfoPath, compare, paired_interval, ratio_of_sums, sim_trace


def recorded_simulators(monkeypatch) -> list:
    """Every ``Simulator`` made from now on, in order (the class is patched where it is looked up)."""
    import llumnix.sim.simulator as simulator

    made: list[simulator.Simulator] = []

    class Recorded(simulator.Simulator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(simulator, "Simulator", Recorded)
    return made


def _pairs():
    rng = np.random.default_rng(7)
    return rng.integers(4, 32, 500), rng.integers(4, 64, 500)


@pytest.mark.parametrize("seed", [0, 3])
def test_the_simulator_gets_the_trace_the_cluster_is_sent(seed):
    pairs = _pairs()
    real = make_requests(ClusterBenchSettings(), pairs, 24, 2.5, seed, vocab=1000)
    sim = sim_trace(pairs, 24, 2.5, seed)
    assert [r.num_input_words for r in real] == list(sim.prompt_lens)
    assert [r.max_tokens for r in real] == list(sim.output_lens)
    assert np.allclose([r.arrival_s for r in real], sim.arrival_times)


def test_paired_ratio_and_its_interval():
    num, den = [1, 2, 0, 3], [2, 2, 4, 2]
    assert ratio_of_sums(num, den) == 0.6
    low, high = paired_interval(num, den)
    assert low < 0.6 < high and low >= 0
    assert paired_interval([1, 1], [1, 1]) == (1.0, 1.0)
    assert ratio_of_sums([1], [0]) is None


def test_the_information_path_follows_the_cluster_config():
    s = ClusterBenchSettings()
    # triggered: the cluster's gap, and its 0.5 s rounds as the backstop
    assert InfoPath.of(s.system_doc("llumnix")) == InfoPath(0.05, 10, 0.03)
    assert InfoPath.of(s.system_doc("infaas++")).trigger_gap_s is None  # no rescheduling, no trigger
    periodic = s.system_doc("llumnix")
    periodic["scheduling"]["rescheduling"]["trigger_gap_s"] = None
    periodic["deployment"]["reschedule_interval_s"] = 0.2
    assert InfoPath.of(periodic) == InfoPath(0.05, 4)


def test_the_simulator_runs_the_clusters_trigger(monkeypatch):
    """A triggered cluster's prediction runs the simulator with its gap: passes between the rounds."""
    from llumnix.bench.sim_vs_real import simulate
    from llumnix.sim.latency import get_latency_model

    made = recorded_simulators(monkeypatch)
    s = ClusterBenchSettings()
    latency = get_latency_model("a10-llama7b-serving")
    out = simulate(s, "llumnix", _pairs(), 40, 12.0, 0, latency)
    sim = made[-1]
    assert sim.config.trigger_gap_s == 0.03 and sim.config.reschedule_every == 10
    assert sim.num_passes > 0 and out["migrations"] > 0
    simulate(s, "infaas++", _pairs(), 40, 12.0, 0, latency)
    assert made[-1].config.trigger_gap_s is None and made[-1].num_passes == 0


def test_compare_predicts_each_load_and_metric(monkeypatch):
    import llumnix.sim.sharegpt as sharegpt

    monkeypatch.setattr(sharegpt, "sharegpt_lengths", lambda model: _pairs())
    s = ClusterBenchSettings(seeds=(0, 1), loads=(0.8,), systems=("infaas++", "llumnix"))

    def run(seed, preempt, ttft):
        return {"load": 0.8, "seed": seed, "num_requests": 16, "num_preemptions": preempt,
                "ttft_s": {"p99": ttft}, "itl_s": {"p99": 0.1}}

    import dataclasses
    record = {"settings": {**dataclasses.asdict(s), "trace": "x"}, "capacity": {"capacity_req_s": 2.0},
              "systems": [{"system": "infaas++", "runs": [run(0, 2, 1.0), run(1, 4, 2.0)]},
                          {"system": "llumnix", "runs": [run(0, 1, 0.5), run(1, 2, 1.0)]}]}
    from llumnix.sim.latency import get_latency_model

    rows = compare(record, get_latency_model("a10-llama7b-serving"), sim_seeds=2, sizing="test")
    assert [(r["load"], r["metric"]) for r in rows] == [(0.8, "num_preemptions"), (0.8, "ttft_p99_s"),
                                                         (0.8, "itl_p99_s")]
    pre = rows[0]
    assert pre["measured"] == 0.5 and pre["seeds"] == [0, 1] and pre["sizing"] == "test"
    assert rows[1]["measured"] == 0.5 and rows[1]["predicted"] is not None and rows[1]["predicted"] > 0
    assert all(r["inside_interval"] in (True, False, None) for r in rows)


def test_the_prediction_is_made_on_the_measured_seeds(monkeypatch):
    """Each seed's trace is its own draw: the prediction paired with a measurement is the
    simulator on the very seeds measured (seed 5 here, outside 0..sim_seeds-1); the
    prediction over seeds 0..sim_seeds-1 rides beside it."""
    import dataclasses

    import llumnix.sim.sharegpt as sharegpt
    from llumnix.bench.sim_vs_real import simulate
    from llumnix.sim.latency import get_latency_model

    monkeypatch.setattr(sharegpt, "sharegpt_lengths", lambda model: _pairs())
    s = ClusterBenchSettings(seeds=(5,), loads=(1.0,), systems=("infaas++", "llumnix"))
    run = {"load": 1.0, "seed": 5, "num_requests": 24, "num_preemptions": 3, "ttft_s": {"p99": 1.0},
           "itl_s": {"p99": 0.1}}
    record = {"settings": {**dataclasses.asdict(s), "trace": "x"}, "capacity": {"capacity_req_s": 12.0},
              "systems": [{"system": "infaas++", "runs": [run]}, {"system": "llumnix", "runs": [run]}]}
    latency = get_latency_model("a10-llama7b-serving")
    rows = {r["metric"]: r for r in compare(record, latency, sim_seeds=2)}
    pairs = trace_pairs(s)  # as compare draws them: ShareGPT's (here _pairs') lengths scaled and capped
    seed5 = {name: simulate(s, name, pairs, 24, 12.0, 5, latency) for name in ("infaas++", "llumnix")}
    first2 = [simulate(s, "infaas++", pairs, 24, 12.0, k, latency)["ttft_p99_s"] for k in (0, 1)]
    ttft = rows["ttft_p99_s"]
    assert ttft["predicted"] == round(seed5["llumnix"]["ttft_p99_s"] / seed5["infaas++"]["ttft_p99_s"], 4)
    assert ttft["predicted_base_mean"] == round(seed5["infaas++"]["ttft_p99_s"], 4)
    assert ttft["predicted_more_seeds_base_mean"] == round(sum(first2) / 2, 4)
    assert ttft["predicted_base_mean"] != ttft["predicted_more_seeds_base_mean"]  # other traces, other values


def test_the_predicted_p99_is_taken_as_the_bench_takes_a_runs(monkeypatch):
    """A run's P99 is its nearest-rank percentile (``cluster_report.pct``: of 24 requests the
    largest); the prediction takes the simulator's requests the same way, not numpy's
    interpolation (which put it between the two largest: a tail read at part of its size)."""
    from llumnix.bench.cluster_report import pct
    from llumnix.bench.sim_vs_real import simulate
    from llumnix.sim.latency import get_latency_model

    made = recorded_simulators(monkeypatch)
    out = simulate(ClusterBenchSettings(), "infaas++", _pairs(), 24, 12.0, 0, get_latency_model("a10-llama7b-serving"))
    sim = made[-1]
    ttft = sorted(m.ttft for m in sim.metrics.requests)
    assert len(ttft) == 24 and out["ttft_p99_s"] == ttft[-1] == pct(ttft, 99)
    assert ttft[-2] < ttft[-1]  # where the two readings differ
    assert out["itl_p99_s"] == pct(list(sim.metrics.token_gaps), 99)


CALIBRATION = {"status_delay_s": 0.17, "migration_start_s": 0.35, "stage_overhead_s": 0.2}
"""A ``calibrate_info_path.py`` JSON's ``simulator`` section (the values are illustrative)."""


def test_a_calibration_sets_the_information_paths_delays():
    s = ClusterBenchSettings()
    assert InfoPath.of(s.system_doc("llumnix"), CALIBRATION) == InfoPath(0.05, 10, 0.03, 0.17, 0.35, 0.2)
    assert InfoPath.of(s.system_doc("llumnix"), {}) == InfoPath(0.05, 10, 0.03)  # nothing measured: no delay


def test_the_simulator_runs_the_calibrated_delays(monkeypatch):
    from llumnix.bench.sim_vs_real import simulate
    from llumnix.sim.latency import get_latency_model

    made = recorded_simulators(monkeypatch)
    latency = get_latency_model("a10-llama7b-serving")
    prompt = simulate(ClusterBenchSettings(), "llumnix", _pairs(), 40, 12.0, 0, latency)
    late = simulate(ClusterBenchSettings(), "llumnix", _pairs(), 40, 12.0, 0, latency, calibration=CALIBRATION)
    sim = made[-1]
    assert (sim.config.status_delay_s, sim.config.migration_start_s) == (0.17, 0.35)
    assert sim.latency.migration.stage_overhead_s == 0.2 and latency.migration.stage_overhead_s != 0.2
    reports = sim.metrics.migrations
    assert reports and all(m.duration >= 0.2 for m in reports if m.committed and m.num_stages)
    assert late != prompt


def test_sim_vs_real_refuses_a_file_that_is_no_calibration_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    bad = tmp_path / "cal.json"
    bad.write_text('{"rows": []}')
    record = tmp_path / "cluster.json"
    record.write_text("{}")
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "llumnix.bench.sim_vs_real", str(record), "--profile",
                           "a10-llama7b-serving", "--calibration", str(bad)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode != 0
    assert "--calibration" in done.stderr and "not a calibration file" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_committed_calibration_is_one_sim_vs_real_reads():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cluster" / "info_path_calibration.json"
    doc = json.loads(path.read_text())
    info = InfoPath.of(ClusterBenchSettings().system_doc("llumnix"), doc["simulator"])
    assert info.status_delay_s > 0 and info.migration_start_s > 0 and info.stage_overhead_s is not None
    # derived from the measurements as the script says, not set by hand
    assert info.migration_start_s == doc["migration_start_s"]["p50"]
    assert info.status_delay_s == max(0.0, doc["status_age_s"]["p50"] - 0.05 / 2)
    assert info.stage_overhead_s == doc["migrations"]["per_stage_s"]["p50"]
