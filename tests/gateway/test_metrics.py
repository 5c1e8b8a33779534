"""The gateway's Prometheus view of the cluster follows its membership."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llumnix.gateway.metrics import GatewayMetrics


def _inst(iid: str, running: int) -> dict:
    return {"instance_id": iid, "freeness": 42.0, "num_running": running,
            "num_used_blocks": 4, "num_total_blocks": 16}


def _samples(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_instances_that_leave_the_cluster_leave_the_per_instance_series():
    m = GatewayMetrics("tiny")
    m.observe_cluster({"instances": [_inst("instance-0", 2), _inst("instance-1", 1)],
                       "gateway": {"num_failed_instances": 0, "num_retired_instances": 0, "num_resumed": 0}})
    before = _samples(m)
    # scale-in stopped instance-1; the gateway retired it
    m.observe_cluster({"instances": [_inst("instance-0", 3)],
                       "gateway": {"num_failed_instances": 0, "num_retired_instances": 1, "num_resumed": 0}})
    after = _samples(m)

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted({"model_name": "tiny", **labels}.items()))

    for series in ("llumnix:instance_freeness", "llumnix:instance_num_running", "vllm:gpu_cache_usage_perc"):
        assert key(series, instance_id="instance-1") in before
        assert key(series, instance_id="instance-1") not in after  # no frozen last value
        assert key(series, instance_id="instance-0") in after
    assert after[key("llumnix:instance_num_running", instance_id="instance-0")] == 3
    assert after[key("llumnix:gateway_instances_lost", outcome="retired")] == 1
    assert after[key("llumnix:gateway_instances_lost", outcome="failed")] == 0
    assert after[key("llumnix:gateway_requests_resumed")] == 0


def test_the_downtime_histogram_observes_each_running_migration_once():
    from llumnix.gateway.metrics import GatewayMetrics

    m = GatewayMetrics("m")

    def scrape(running: int, recent: list[float]) -> float:
        m.observe_cluster({"migrations": {"committed": running + 5, "aborted": 0, "committed_running": running,
                                          "committed_queued": 5, "recent_downtimes_s": recent}})
        return m.registry.get_sample_value("llumnix:migration_downtime_seconds_count", {"model_name": "m"})

    assert scrape(2, [0.01, 0.02]) == 2
    assert scrape(2, [0.01, 0.02]) == 2  # nothing new
    assert scrape(5, [0.01, 0.02, 0.03, 0.04, 0.05]) == 5
    assert scrape(1005, [0.01] * 1000) == 1005  # the window holds the last 1,000
