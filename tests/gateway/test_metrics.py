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
