"""The information path in the simulator (issue 45): a status report reaches the
rescheduler ``status_delay_s`` after it is made (dispatch at once), and a pass's migration order reaches its
source ``migration_start_s`` after the pass, which picks the request then."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from llumnix.sim.cluster import ClusterConfig
from llumnix.sim.config import ConfigError, SystemSpec, parse_config
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.simulator import Simulator
from tests.sim.test_trigger import overloaded


def _sim(**info: Any) -> Simulator:
    """The overloaded cluster of the trigger's tests, triggered (0.03 s gap), with ``info``'s delays."""
    trace, cluster = overloaded(trigger_gap_s=0.03, **info)
    policy = make_policy(SystemSpec("llumnix", "llumnix", enable_migration=True), cluster, seed=0)
    return Simulator(cluster, get_latency_model("a10-llama7b-serving"), policy, trace)


def _orders(sim: Simulator) -> list[tuple[float, str]]:
    """Record each migration order's (time, source)."""
    orders: list[tuple[float, str]] = []
    policy: Any = sim.policy
    on_order = policy.on_order

    def recorded(src_id: str, dst_id: str) -> float | None:
        orders.append((policy._now(), src_id))
        return on_order(src_id, dst_id)

    policy.on_order = recorded
    return orders


def test_a_status_reaches_the_scheduler_status_delay_s_after_it_was_made():
    ages: dict[float, list[float]] = {}
    for delay in (0.0, 0.02):
        sim = _sim(status_delay_s=delay)
        policy: Any = sim.policy
        pair = policy.pair_migrations
        seen: list[float] = ages.setdefault(delay, [])

        def recorded(pair=pair, policy=policy, seen=seen) -> list[tuple[str, str]]:
            now = policy._now()
            seen.extend(now - s.timestamp for s in policy.gs_decode.statuses.values())
            return pair()

        policy.pair_migrations = recorded
        out = sim.run()
        assert out["migrations"]["num_committed"] > 0
    assert min(ages[0.0]) == 0.0  # a report made at the pass's instant is read at once
    assert min(ages[0.02]) >= 0.02 - 1e-9  # never fresher than the delay


def test_dispatch_reads_each_report_at_once_while_the_rescheduler_waits():
    sim = _sim(status_delay_s=0.02)
    policy: Any = sim.policy
    assert policy.gs_decode is not policy.gs
    dispatch = policy.dispatch
    lags: list[float] = []

    def recorded(*args: Any, **kw: Any) -> str | None:
        now = policy._now()
        lags.append(min(now - s.timestamp for s in policy.gs.statuses.values()))
        return dispatch(*args, **kw)

    policy.dispatch = recorded
    sim.run()
    assert min(lags) < 0.02  # a dispatch saw a report younger than the delay
    prompt: Any = _sim().policy
    assert prompt.gs_decode is prompt.gs  # one scheduler without the delay


def test_a_migration_starts_migration_start_s_after_its_order():
    start_s = 0.04
    sim = _sim(migration_start_s=start_s)
    orders = _orders(sim)
    out = sim.run()
    assert out["migrations"]["num_committed"] > 0
    ordered = {(round(t + start_s, 9), src) for t, src in orders}
    ends = {round(m.end_time, 9) for m in sim.metrics.migrations}
    firsts = [m for m in sim.metrics.migrations if round(m.start_time, 9) not in ends]  # not a chain's next move
    assert len(firsts) >= 5
    assert all((round(m.start_time, 9), m.src_instance_id) in ordered for m in firsts)


def test_without_the_delays_nothing_waits():
    sim = _sim()
    orders = _orders(sim)
    sim.run()
    starts = {round(m.start_time, 9) for m in sim.metrics.migrations}
    assert orders and {round(t, 9) for t, _ in orders} & starts  # an order starts its migration at once


def test_the_delayed_runs_are_deterministic_and_differ_from_the_prompt_one():
    def summary(**info: Any) -> dict[str, Any]:
        out = _sim(**info).run()
        out.pop("sim")  # wall and CPU time
        return out

    delayed = summary(status_delay_s=0.02, migration_start_s=0.04)
    assert delayed == summary(status_delay_s=0.02, migration_start_s=0.04)
    assert delayed != summary()


def test_the_delays_are_cluster_settings_checked_in_one_line():
    doc = """
name: t
cluster: {num_instances: 2, status_delay_s: 0.01, migration_start_s: 0.05}
systems: {llumnix: {dispatch: llumnix, migration: true}}
traces: [{name: M-M, kind: M-M, rates: [1.0]}]
"""
    cluster = parse_config(yaml.safe_load(doc)).cluster
    assert (cluster.status_delay_s, cluster.migration_start_s) == (0.01, 0.05)
    with pytest.raises(ConfigError, match="migration_start_s must be >= 0"):
        parse_config(yaml.safe_load(doc.replace("0.05", "-1")))
    with pytest.raises(ValueError, match="status_delay_s"):
        ClusterConfig(status_delay_s=-0.1)
    pd = SystemSpec("pd", "llumnix", enable_migration=True, options={"pd": {"mode": "static"}})
    with pytest.raises(ValueError, match="status_delay_s: not simulated with PD"):
        make_policy(pd, ClusterConfig(num_instances=2, status_delay_s=0.01))
