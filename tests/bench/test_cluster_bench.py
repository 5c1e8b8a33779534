"""`llumnix bench cluster` without a cluster: the trace, the settings, one run's record
from literal counters and samples, the aggregate over seeds, the goals, /metrics parsing."""
from __future__ import annotations

import numpy as np
import pytest

from llumnix.bench.cluster_bench import (
    ClusterBenchSettings,
    make_requests,
    requests_per_run,
    scaled_pairs,
    settings_from_args,
)
from llumnix.bench.cluster_report import REFUSED, aggregate, goals, run_record
from llumnix.bench.cluster_server import metric_sums
from llumnix.bench.serve_bench import RequestRecord
from llumnix.cli import build_parser
from llumnix.core.errors import LlumnixError

S = ClusterBenchSettings()
PAIRS = (np.array([8, 400, 2000, 80]), np.array([40, 1000, 8, 200]))


def test_lengths_are_scaled_and_capped():
    p, o = scaled_pairs(ClusterBenchSettings(max_input=96, max_output=64), *PAIRS)
    assert p.tolist() == [4, 50, 96, 10] and o.tolist() == [5, 64, 4, 25]
    p, o = scaled_pairs(S, *PAIRS)  # the defaults: prompts at most 32
    assert p.tolist() == [4, 32, 32, 10] and o.tolist() == [5, 64, 4, 25]


def test_a_trace_is_seeded_and_keeps_its_requests_across_rates():
    pairs = scaled_pairs(S, *PAIRS)
    a = make_requests(S, pairs, 12, 1.0, seed=3, vocab=49152)
    b = make_requests(S, pairs, 12, 2.0, seed=3, vocab=49152)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.arrival_s for r in b] == pytest.approx([r.arrival_s / 2 for r in a])
    assert all(len(r.prompt) == r.num_input_words for r in a)
    burst = make_requests(S, pairs, 5, None, seed=3, vocab=49152)
    assert {r.arrival_s for r in burst} == {0.0}
    assert make_requests(S, pairs, 12, 1.0, seed=4, vocab=49152)[0].prompt != a[0].prompt


def _args(*extra):
    return build_parser().parse_args(["bench", "cluster", *extra])


def test_flags_map_onto_the_settings_and_bad_ones_are_one_line_errors():
    s = settings_from_args(_args("--systems", "infaas++,llumnix", "--seeds", "0,5", "--loads", "0.5,1",
                                 "--num-blocks", "20", "--device", "cuda"))
    assert s.systems == ("infaas++", "llumnix") and s.seeds == (0, 5) and s.loads == (0.5, 1.0)
    doc = s.system_doc("llumnix")
    assert doc["engine"]["device"] == "cuda" and doc["engine"]["num_blocks"] == 20
    assert doc["scheduling"]["rescheduling"]["enabled"] is True
    assert s.system_doc("llumnix-default")["engine"].get("enable_prefix_caching") is None  # serve's default
    assert "gpus_per_instance" not in doc["deployment"]  # serve's default: a GPU each
    packed = settings_from_args(_args("--device", "cuda", "--instances", "8", "--gpus-per-instance", "0.125"))
    assert packed.system_doc("infaas++")["deployment"] == {"instances": 8, "gpus_per_instance": 0.125}
    s = settings_from_args(_args("--prompt-cap", "32", "--output-cap", "80", "--length-scale", "0.5"))
    assert (s.max_input, s.max_output, s.scale) == (32, 80, 0.5)
    with pytest.raises(LlumnixError, match="unknown 'nope'"):
        settings_from_args(_args("--systems", "nope"))
    with pytest.raises(LlumnixError, match="--seeds"):
        settings_from_args(_args("--seeds", "a,b"))
    with pytest.raises(LlumnixError, match="would not fit 4 blocks"):
        settings_from_args(_args("--num-blocks", "4"))


def test_run_seconds_sizes_the_poisson_runs_from_the_probed_capacity():
    assert requests_per_run(S, 50.0) == S.num_requests  # without it: the fixed count
    s = settings_from_args(_args("--run-seconds", "4", "--requests-per-run", "64"))
    assert requests_per_run(s, 50.0) == 200 and requests_per_run(s, 5.0) == 64  # never under the count
    with pytest.raises(LlumnixError, match="--run-seconds must be > 0"):
        settings_from_args(_args("--run-seconds", "0"))


def _rec(ttft, e2e, n, itl):
    r = RequestRecord(arrival_s=0.0, ttft_s=ttft, e2e_s=e2e, num_output_tokens=n)
    r.itl_s = list(itl)
    return r


def _counters(preempt, ok, aborted, running, downtimes, aborts):
    return {"num_preemptions": preempt, "migrations_committed": ok, "migrations_aborted": aborted,
            "committed_running": running, "downtimes_s": downtimes, "aborts_by_reason": aborts}


RAW = {
    "records": [_rec(0.5, 2.5, 11, [0.2] * 10), _rec(6.0, 7.0, 3, [0.5, 0.5]), RequestRecord(0.0, error="HTTP 500")],
    "duration_s": 10.0,
    "before": _counters(3, 2, 1, 2, [0.01, 0.02], {REFUSED: 1.0, "timeout": 0.0, "source_finished": 0.0}),
    "after": _counters(7, 4, 3, 3, [0.01, 0.02, 0.03], {REFUSED: 2.0, "timeout": 1.0, "source_finished": 0.0}),
    "samples": [
        {"t": 0.0, "instances": [{"num_used_blocks": 8, "num_total_blocks": 32}, {"num_used_blocks": 0,
                                                                                  "num_total_blocks": 32}]},
        {"t": 0.5, "instances": [{"num_used_blocks": 32, "num_total_blocks": 32}, {"num_used_blocks": 16,
                                                                                   "num_total_blocks": 32}]},
    ],
}


def test_one_runs_record_from_counters_samples_and_client_records():
    r = run_record(S, RAW, 0.85, 0, 1.5)
    assert (r["num_preemptions"], r["migrations_committed"], r["migrations_aborted"]) == (4, 2, 2)
    assert r["abort_reasons"] == {REFUSED: 1, "timeout": 1}  # the counters' growth; reasons at 0 left out
    assert r["downtime_s"]["max"] == 0.03 and r["downtime_s"]["mean"] == pytest.approx(0.03)
    assert r["num_ok"] == 2 and r["errors"] == ["HTTP 500"]
    assert r["ttft_s"]["max"] == 6.0 and r["itl_s"]["max"] == 0.5
    assert r["tpot_s"]["p50"] == pytest.approx(0.2)
    # goodput at TTFT <= 5 s and TPOT <= 0.5 s: the first request only
    assert r["goodput_req_s"] == pytest.approx(0.1)
    assert r["kv_usage"]["series"] == [(0.0, 0.125), (0.5, 0.75)] and r["kv_usage"]["max"] == 0.75


def _sys(name, runs):
    return {"system": name, "runs": [{**run_record(S, RAW, load, seed, 1.0), **over} for load, seed, over in runs]}


def test_aggregate_over_seeds_and_the_goals():
    systems = [
        _sys("round-robin", [("burst", 0, {"ttft_s": {"mean": 1.0, "p50": 1.0, "p99": 2.0, "max": 2.0}})]),
        _sys("infaas++", [(1.0, 0, {"num_preemptions": 10}), (1.0, 1, {"num_preemptions": 10}),
                          ("burst", 0, {"ttft_s": {"mean": 1.5, "p50": 1.0, "p99": 1.0, "max": 2.0}})]),
        _sys("llumnix", [(1.0, 0, {"num_preemptions": 6}), (1.0, 1, {"num_preemptions": 7}),
                         ("burst", 0, {"ttft_s": {"mean": 0.9, "p50": 1.0, "p99": 1.9, "max": 2.0}})]),
    ]
    agg = aggregate(systems)
    assert agg["llumnix"]["1.0"]["num_preemptions"] == 13 and agg["llumnix"]["1.0"]["num_seeds"] == 2
    g = goals(agg, (1.0,))
    assert g["llumnix"]["1.0"]["met"] is True  # 13 <= 0.7 x 20
    assert g["llumnix"]["reservation_refusals"] == {"refused": 3, "started": 12, "met": False}
    assert g["burst_vs_round_robin"]["llumnix"]["met"] is True
    assert g["burst_vs_round_robin"]["infaas++"]["met"] is False  # mean 1.5 > 1.0


def test_metric_sums_add_the_instances_and_keep_the_outcome():
    text = """# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="instance-0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="instance-1",model_name="m"} 4.0
# TYPE llumnix:migrations counter
llumnix:migrations_total{model_name="m",outcome="committed"} 5.0
llumnix:migrations_total{model_name="m",outcome="aborted"} 1.0
"""
    m = metric_sums(text)
    assert m["vllm:num_preemptions_total"] == 7.0
    assert m["llumnix:migrations_total{outcome=committed}"] == 5.0
    assert m["llumnix:migrations_total{outcome=aborted}"] == 1.0


def test_the_abort_reasons_are_read_from_the_counters_and_survive_a_counter_reset():
    from llumnix.bench.cluster_server import aborts_by_reason

    text = """# TYPE llumnix:migration_aborts counter
llumnix:migration_aborts_total{model_name="m",reason="refused"} 2.0
llumnix:migration_aborts_total{model_name="m",reason="source_finished"} 5.0
llumnix:migrations_total{model_name="m",outcome="aborted"} 7.0
"""
    got = aborts_by_reason(metric_sums(text))
    assert got == {"refused": 2.0, "source_finished": 5.0}
    # LlumSched restarted during the run: its counter started again at 0 and holds 1 now
    before = {**RAW["before"], "aborts_by_reason": got}
    after = {**RAW["after"], "aborts_by_reason": {"refused": 1.0, "source_finished": 6.0}}
    r = run_record(S, {**RAW, "before": before, "after": after}, 1.0, 0, 1.0)
    assert r["abort_reasons"] == {"refused": 1, "source_finished": 1}


def test_preemptions_count_per_instance_and_a_replacement_counts_its_own():
    from llumnix.bench.cluster_report import preemptions_between

    before = {"num_preemptions": 9.0, "preemptions_by_engine": {"p{engine=instance-0}": 5.0,
                                                               "p{engine=instance-1}": 4.0}}
    # instance-1 was lost and replaced by instance-2, which preempted 2; instance-0 3 more
    after = {"num_preemptions": 10.0, "preemptions_by_engine": {"p{engine=instance-0}": 8.0,
                                                              "p{engine=instance-2}": 2.0}}
    assert preemptions_between(before, after) == 5
    # a counter that started again (a restarted instance under the same id) counts from 0
    after = {"num_preemptions": 6.0, "preemptions_by_engine": {"p{engine=instance-0}": 5.0,
                                                             "p{engine=instance-1}": 1.0}}
    assert preemptions_between(before, after) == 1


def test_the_probes_steady_state_is_read_over_its_window_only():
    from llumnix.bench.cluster_probe import steady_state

    def sample(t, used, waiting):
        return {"t": t, "instances": [{"num_used_blocks": used, "num_total_blocks": 10, "num_running": 3,
                                       "num_waiting": waiting},
                                      {"num_used_blocks": 10, "num_total_blocks": 10, "num_running": 2,
                                       "num_waiting": 1}]}

    # ramp-up (t < 2) and drain (t > 6) are left out
    samples = [sample(0.5, 0, 0), sample(1.5, 4, 0), sample(2.5, 9, 5), sample(4.0, 8, 3), sample(5.5, 9, 1),
               sample(7.0, 0, 0)]
    got = steady_state(samples, 2.0, 6.0)
    assert got["kv_usage"] == pytest.approx((0.95 + 0.9 + 0.95) / 3)
    assert (got["num_running"], got["num_waiting"]) == (5.0, 4.0)
    assert steady_state(samples, 8.0, 9.0) == {"kv_usage": None, "num_running": None, "num_waiting": None}


def test_kv_binds_when_requests_queue_at_a_nearly_full_cache_under_the_batch_limit():
    from llumnix.bench.cluster_probe import kv_binds

    def steady(kv, running, waiting):
        return {"kv_usage": kv, "num_running": running, "num_waiting": waiting}

    assert kv_binds(S, steady(0.849, 7.1, 7.9))  # the default sizing's probe, 2026-11-26
    assert not kv_binds(S, steady(0.5, 7.0, 8.0))  # queued with the cache half empty: not KV
    assert not kv_binds(S, steady(0.95, 7.0, 0.5))  # full, but nothing waits for it
    assert not kv_binds(S, steady(0.95, 64.0, 9.0))  # the batch limit binds
    assert not kv_binds(S, steady(None, None, None))


def test_the_probe_is_sized_from_its_flags_and_checked():
    s = settings_from_args(_args("--probe-concurrency", "48", "--probe-requests", "144"))
    assert (s.probe_concurrency, s.probe_requests) == (48, 144)
    with pytest.raises(LlumnixError, match="--probe-requests >= 2 x it"):
        settings_from_args(_args("--probe-concurrency", "48", "--probe-requests", "90"))


def test_sim_calibration_needs_with_sim_and_a_file(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text("{}")
    settings_from_args(_args("--with-sim", "a10-llama7b-serving", "--sim-calibration", str(cal)))
    with pytest.raises(LlumnixError, match="--sim-calibration .*: needs --with-sim"):
        settings_from_args(_args("--sim-calibration", str(cal)))
    with pytest.raises(LlumnixError, match="--sim-calibration .*: no such file"):
        settings_from_args(_args("--with-sim", "a10-llama7b-serving", "--sim-calibration", str(tmp_path / "none")))


@pytest.mark.parametrize("interleave", [False, True])
def test_systems_run_one_after_the_other_or_alternated_point_by_point(monkeypatch, tmp_path, interleave):
    """With ``--interleave`` every system's cluster is up at once and the runs alternate
    (the order reversed every other point), so a drifting machine load weighs on each
    alike; without it, one system's runs all come before the next's. Either way each
    system's record holds its own runs, and the probe runs once."""
    from llumnix.bench import cluster_bench, cluster_probe, cluster_report

    s = settings_from_args(_args("--systems", "infaas++,llumnix", "--seeds", "0,1", "--loads", "0.6",
                                 "--burst-size", "0", *(["--interleave"] if interleave else [])))
    opened: list[str] = []
    ran: list[tuple[str, int]] = []

    def open_system(s_, name, out, stack):
        opened.append(name)
        stack.callback(opened.append, f"closed {name}")
        return name, 0.1, None

    monkeypatch.setattr(cluster_bench, "_open_system", open_system)
    monkeypatch.setattr(cluster_probe, "probe_capacity", lambda *a: {"capacity_req_s": 2.0, "rule": "test"})
    monkeypatch.setattr(cluster_bench, "run_once", lambda server, reqs, trace=None: server)
    monkeypatch.setattr(cluster_report, "run_record",
                        lambda s_, server, load, seed, rate: (ran.append((server, seed)), {"line": "x", "seed": seed})[1])
    recs = cluster_bench.run_systems(s, ["infaas++", "llumnix"], tmp_path, PAIRS, 256, None, log=lambda m: None)
    assert [r["system"] for r in recs] == ["infaas++", "llumnix"]
    assert [[run["seed"] for run in r["runs"]] for r in recs] == [[0, 1], [0, 1]]
    if interleave:
        assert opened == ["infaas++", "llumnix", "closed llumnix", "closed infaas++"]
        assert ran == [("infaas++", 0), ("llumnix", 0), ("llumnix", 1), ("infaas++", 1)]
    else:
        assert opened == ["infaas++", "closed infaas++", "llumnix", "closed llumnix"]
        assert ran == [("infaas++", 0), ("infaas++", 1), ("llumnix", 0), ("llumnix", 1)]


def test_a_run_says_how_late_the_client_sent_and_the_gateways_own_ttft():
    """On a loaded machine the client's event loop falls behind: requests leave late (the
    server sees another trace) and first chunks are read late (the client's TTFT grows while
    the gateway's does not). A run's record and line say both (issue 45)."""
    late = [_rec(0.5, 2.5, 11, [0.2] * 10), _rec(6.0, 7.0, 3, [0.5, 0.5])]
    late[0].send_lag_s, late[1].send_lag_s = 0.01, 3.0
    before = {**RAW["before"], "gateway_ttft_sum_s": 1.0, "gateway_ttft_count": 4.0}
    after = {**RAW["after"], "gateway_ttft_sum_s": 1.6, "gateway_ttft_count": 6.0}
    r = run_record(S, {**RAW, "records": late, "before": before, "after": after}, 0.85, 0, 1.5)
    assert r["send_lag_s"]["max"] == 3.0 and r["gateway_ttft_mean_s"] == pytest.approx(0.3)
    assert "sent late P99 3000 ms" in r["line"] and "gateway TTFT mean 300 ms" in r["line"]
    plain = run_record(S, RAW, 0.85, 0, 1.5)  # counters without the gateway's TTFT, records without lags
    assert plain["gateway_ttft_mean_s"] is None and "sent late" not in plain["line"]
