"""The gateway's Prometheus view: vLLM's names and types for what dashboards, autoscalers
and routers read, counters for cumulative counts, per-instance series that follow the
cluster's membership."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llumnix.cluster.meta_store import status_summary
from llumnix.gateway.inprocess import InProcessGateway
from llumnix.gateway.metrics import TTFT_BUCKETS, GatewayMetrics
from llumnix.policy import FreenessConfig
from tests.gateway.fake_backend import EngineBackend

# What vLLM's Grafana dashboard (examples/observability/prometheus_grafana/grafana.json)
# and the usual KEDA / HPA (prometheus-adapter) rules read, with the type vLLM gives each.
DASHBOARD = {
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_success": "counter",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:cache_config_info": "gauge",
}
OURS = {
    "llumnix:instance_freeness": "gauge",
    "llumnix:dispatches": "counter",
    "llumnix:migrations": "counter",
    "llumnix:migration_downtime_seconds": "histogram",
    "llumnix:gateway_instances_lost": "counter",
    "llumnix:gateway_requests_resumed": "counter",
}


def _inst(iid: str, running: int, **extra: Any) -> dict:
    return {"instance_id": iid, "freeness": 42.0, "num_running": running, "num_waiting": 1,
            "num_used_blocks": 4, "num_total_blocks": 16, **extra}


def _samples(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({"model_name": "tiny", **labels}.items()))


def test_instances_that_leave_the_cluster_leave_the_per_instance_series():
    m = GatewayMetrics("tiny")
    gw = {"num_failed_instances": 0, "num_retired_instances": 0, "num_resumed": 0}
    m.observe_cluster({"instances": [_inst("instance-0", 2), _inst("instance-1", 1)], "gateway": gw})
    before = _samples(m)
    # scale-in stopped instance-1; the gateway retired it
    m.observe_cluster({"instances": [_inst("instance-0", 3)], "gateway": {**gw, "num_retired_instances": 1}})
    after = _samples(m)
    for series, label in (("llumnix:instance_freeness", "instance_id"), ("vllm:num_requests_running", "engine"),
                          ("vllm:num_requests_waiting", "engine"), ("vllm:kv_cache_usage_perc", "engine")):
        assert _key(series, **{label: "instance-1"}) in before
        assert _key(series, **{label: "instance-1"}) not in after  # no frozen last value
        assert _key(series, **{label: "instance-0"}) in after
    assert after[_key("vllm:num_requests_running", engine="instance-0")] == 3
    assert after[_key("vllm:kv_cache_usage_perc", engine="instance-0")] == 0.25
    assert after[_key("llumnix:gateway_instances_lost_total", outcome="retired")] == 1
    assert after[_key("llumnix:gateway_instances_lost_total", outcome="failed")] == 0
    assert after[_key("llumnix:gateway_requests_resumed_total")] == 0


def test_an_unreadable_cluster_view_serves_no_stale_cluster_series():
    m = GatewayMetrics("tiny")
    m.observe_cluster({"instances": [_inst("instance-0", 2)], "num_dispatched": 5})
    assert _key("vllm:num_requests_running", engine="instance-0") in _samples(m)
    m.observe_cluster(None)
    names = {name for name, _ in _samples(m)}
    assert not any(n.startswith(("vllm:num_requests", "llumnix:dispatches")) for n in names)
    assert "vllm:time_to_first_token_seconds_count" in names  # the gateway's own still served


def test_cumulative_counts_from_the_cluster_are_counters():
    m = GatewayMetrics("tiny")
    info = {"dispatch_policy": "llumnix", "num_dispatched": 7,
            "migrations": {"committed": 3, "aborted": 1, "committed_running": 2, "in_flight": ["r"],
                           "blocks_sent": 40, "blocks_adopted": 8, "recent_downtimes_s": [0.01, 0.02]},
            "instances": [_inst("instance-0", 1, num_preemptions=2, num_prefix_cache_queries=100,
                                num_prefix_cache_hits=60, block_size=16)]}
    m.observe_cluster(info)
    text = generate_latest(m.registry).decode()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name in ("llumnix:dispatches", "llumnix:migrations", "llumnix:migration_blocks_sent",
                 "llumnix:migration_blocks_adopted", "vllm:num_preemptions", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits"):
        assert types[name] == "counter", name
        assert f"# TYPE {name}_total counter" in text  # the text format's spelling, as vLLM's
    s = _samples(m)
    assert s[_key("llumnix:dispatches_total", policy="llumnix")] == 7
    assert s[_key("llumnix:migrations_total", outcome="committed")] == 3
    assert s[_key("llumnix:migrations_total", outcome="aborted")] == 1
    assert s[_key("vllm:prefix_cache_hits_total", engine="instance-0")] == 60
    assert s[_key("vllm:num_preemptions_total", engine="instance-0")] == 2
    assert s[_key("llumnix:migrations_in_flight")] == 1
    assert s[_key("vllm:cache_config_info", engine="instance-0", block_size="16", num_gpu_blocks="16")] == 1


def test_the_downtime_histogram_observes_each_running_migration_once():
    m = GatewayMetrics("m")

    def scrape(running: int, recent: list[float]) -> float:
        m.observe_cluster({"migrations": {"committed": running + 5, "aborted": 0, "committed_running": running,
                                          "committed_queued": 5, "recent_downtimes_s": recent}})
        return m.registry.get_sample_value("llumnix:migration_downtime_seconds_count", {"model_name": "m"})

    assert scrape(2, [0.01, 0.02]) == 2
    assert scrape(2, [0.01, 0.02]) == 2  # nothing new
    assert scrape(5, [0.01, 0.02, 0.03, 0.04, 0.05]) == 5
    assert scrape(1005, [0.01] * 1000) == 1005  # the window holds the last 1,000


class StatusBackend(EngineBackend):
    """The test engine behind the gateway, its cluster view built from its real status as
    LlumSched's ``/admin/cluster`` builds it."""

    async def cluster_info(self) -> dict[str, Any]:
        status = self.engine.get_status()
        return {"dispatch_policy": "llumnix", "num_dispatched": 0,
                "migrations": {"committed": 0, "aborted": 0, "committed_running": 0, "in_flight": [],
                               "recent_downtimes_s": []},
                "instances": [status_summary(status, FreenessConfig(), time.time())],
                "gateway": {"num_failed_instances": 0, "num_retired_instances": 0, "num_resumed": 0}}


def test_a_scrape_of_a_serving_gateway_has_what_vllm_dashboards_and_autoscalers_read():
    backend = StatusBackend(prefix_caching=True)
    prompt = "a shared prefix of some length " * 2
    with InProcessGateway(backend) as url, httpx.Client(timeout=30) as c:
        n_out = []
        for i in range(3):
            body = {"model": "fake", "prompt": prompt, "max_tokens": 5 + i, "ignore_eos": True,
                    "stream": i == 1}
            r = c.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text
            if i == 1:
                usage = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
                assert usage[-1]["choices"][0]["finish_reason"] == "length"
            n_out.append(5 + i)
        text = c.get(f"{url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in {**DASHBOARD, **OURS}.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
        assert f"# TYPE {name}{'_total' if kind == 'counter' else ''} {kind}" in text
    assert "vllm:gpu_cache_usage_perc" not in text and "vllm:time_per_output_token_seconds" not in text

    def value(name: str, **labels: str) -> float:
        return next(s.value for f in families.values() for s in f.samples
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    iid = backend.engine.instance_id
    assert value("vllm:request_success_total", finished_reason="length") == 3
    assert value("vllm:generation_tokens_total") == sum(n_out)
    assert value("vllm:time_to_first_token_seconds_count") == 3
    assert value("vllm:inter_token_latency_seconds_count") == sum(n - 1 for n in n_out)  # one token an output
    assert value("vllm:e2e_request_latency_seconds_count") == 3
    assert value("vllm:request_queue_time_seconds_count") == 3
    assert value("vllm:num_requests_running", engine=iid) == 0  # all finished
    assert value("vllm:kv_cache_usage_perc", engine=iid) == 0
    # the same prompt three times: the second and third find the first one's full blocks
    queries, hits = value("vllm:prefix_cache_queries_total", engine=iid), value("vllm:prefix_cache_hits_total",
                                                                                 engine=iid)
    n_prompt = len(prompt.encode())
    assert queries == 3 * n_prompt
    assert hits == 2 * (n_prompt // 4) * 4
    assert value("llumnix:prompt_tokens_cached_total") == hits
    ttft_buckets = sorted({float(s.labels["le"]) for s in families["vllm:time_to_first_token_seconds"].samples
                           if s.name.endswith("_bucket")})
    assert ttft_buckets[:-1] == list(TTFT_BUCKETS)  # vLLM's buckets, then +Inf
