"""Triggered rescheduling in the simulator (``ClusterConfig.trigger_gap_s``): the cluster's
trigger (``policy/trigger.py``) on every status report, a pass at once or when the gap ends,
the periodic rounds kept as the backstop."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import ConfigError, SystemSpec, parse_config
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import Trace

ROUND_S = 0.5  # status_interval_s 0.05 x reschedule_every 10: LlumSched's periodic round
GAP_S = 0.03


def overloaded(**fields: Any) -> tuple[Trace, ClusterConfig]:
    """An overloaded 4-instance cluster (10 KV blocks each; ``fields`` set more of its config)
    and its trace: sources appear all the time."""
    n, rate = 60, 16.0
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals[0] = 0.0
    trace = Trace("t", rate, 0, arrivals, rng.integers(8, 32, n), rng.integers(16, 64, n), np.zeros(n, np.int64))
    return trace, ClusterConfig(num_instances=4, num_blocks=10, block_size=16, max_num_seqs=32, chunked_prefill=True,
                                max_model_len=160, status_interval_s=0.05, reschedule_every=10, **fields)


def _run(gap: float | None) -> tuple[dict, list[tuple[float, float | None]], float]:
    """The overloaded cluster with the trigger's ``gap``: the summary, each migration order's
    (time, reaction time), and one step's bound."""
    trace, cluster = overloaded(trigger_gap_s=gap)
    policy = make_policy(SystemSpec("llumnix", "llumnix", enable_migration=True), cluster, seed=0)
    orders: list[tuple[float, float | None]] = []
    on_order = policy.on_order

    def recorded(src_id: str, dst_id: str) -> float | None:
        reaction = on_order(src_id, dst_id)
        orders.append((policy._now(), reaction))
        return reaction

    policy.on_order = recorded  # type: ignore[method-assign]
    latency = get_latency_model("a10-llama7b-serving")
    tokens = cluster.num_blocks * cluster.block_size  # an instance's KV bounds a step's tokens
    one_step = latency.prefill_time([tokens]) + latency.decode_time(cluster.max_num_seqs, tokens)
    return Simulator(cluster, latency, policy, trace).run(), orders, one_step


def test_a_new_source_migrates_within_the_gap_with_the_trigger_on():
    out, orders, one_step = _run(GAP_S)
    reactions = [r for _, r in orders if r is not None]
    assert len(reactions) >= 10 and out["migrations"]["num_committed"] >= 10
    assert max(reactions) <= GAP_S + one_step
    # passes between the rounds: most orders are not at a round boundary
    off_round = [t for t, _ in orders if abs(t / ROUND_S - round(t / ROUND_S)) > 1e-9]
    assert len(off_round) > len(orders) / 2
    r = out["rescheduling"]
    assert r["trigger_gap_s"] == GAP_S and r["num_passes"] > 0 and r["num_triggers"] >= r["num_passes"]
    assert r["reaction_s"]["count"] == len(reactions)
    assert r["reaction_s"]["p99"] <= GAP_S + one_step
    assert r["reaction_s"]["p50"] == pytest.approx(float(np.percentile(reactions, 50)))


def test_passes_keep_the_gap_apart():
    _, orders, _ = _run(GAP_S)
    times = sorted({t for t, _ in orders if abs(t / ROUND_S - round(t / ROUND_S)) > 1e-9})
    assert all(b - a >= GAP_S - 1e-9 for a, b in zip(times, times[1:], strict=False))


def test_without_the_trigger_migrations_start_only_at_round_boundaries():
    out, orders, _ = _run(None)
    assert orders
    assert all(math.isclose(t / ROUND_S, round(t / ROUND_S), abs_tol=1e-9) for t, _ in orders)
    r = out["rescheduling"]
    assert r["trigger_gap_s"] is None and r["num_passes"] == 0 and r["num_rounds"] > 0
    assert r["reaction_s"] is None  # marks are not computed without the trigger


def test_the_trigger_run_is_deterministic():
    a, b = _run(GAP_S)[0], _run(GAP_S)[0]
    a.pop("sim"), b.pop("sim")  # wall and CPU time
    assert a == b


def test_the_gap_is_a_cluster_setting():
    doc = """
name: t
cluster: {num_instances: 2, trigger_gap_s: 0.03}
systems: {llumnix: {dispatch: llumnix, migration: true}}
traces: [{name: M-M, kind: M-M, rates: [1.0]}]
"""
    assert parse_config(yaml.safe_load(doc)).cluster.trigger_gap_s == 0.03
    with pytest.raises(ConfigError, match="trigger_gap_s must be >= 0"):
        parse_config(yaml.safe_load(doc.replace("0.03", "-1")))
    with pytest.raises(ValueError, match="trigger_gap_s"):
        ClusterConfig(trigger_gap_s=-0.1)


_CLI_CONFIG = """
name: trig
latency_model: a10-llama7b-serving
num_requests: 200
plots: false
cluster: {num_instances: 4, num_blocks: 400, trigger_gap_s: GAP}
systems:
  llumnix: {dispatch: llumnix, migration: true}
traces:
  - {name: M-M, kind: M-M, rates: [6.0]}
"""


def _simulate(tmp_path, gap: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "trig.yaml"
    cfg.write_text(_CLI_CONFIG.replace("GAP", gap))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    return subprocess.run([sys.executable, "-m", "llumnix.cli", "simulate", str(cfg), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=300)


def test_llumnix_simulate_reports_the_triggers_passes_and_reaction_times(tmp_path):
    done = _simulate(tmp_path, "0.03")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())["records"][0]
    r = record["rescheduling"]
    assert r["trigger_gap_s"] == 0.03 and r["num_passes"] > 0 and r["reaction_s"]["count"] > 0
    assert 0 <= r["reaction_s"]["p50"] <= r["reaction_s"]["p99"]


def test_llumnix_simulate_refuses_a_negative_gap_in_one_line(tmp_path):
    done = _simulate(tmp_path, "-1")
    assert done.returncode != 0
    assert "trigger_gap_s must be >= 0" in done.stderr and "Traceback" not in done.stderr
