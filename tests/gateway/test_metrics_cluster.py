"""A real cluster (Ray actors, LlumSched, two instances of a tiny Llama) behind the gateway
over HTTP: /metrics has each instance's series under vLLM's names, the cluster's counts as
counters, and a migrated request's log line names where it finished and its migration."""
from __future__ import annotations

import json
import logging
import re
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.test_metrics import DASHBOARD, OURS

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _stream_migrating_once(url: str, body: dict, instances: dict) -> tuple[str, str]:
    """Stream a completion to its end, live-migrating its request to the other instance
    after the first chunk: (request id, destination)."""
    from tests.cluster.helpers import where_is

    rid = dst = None
    with httpx.stream("POST", f"{url}/v1/completions", timeout=60, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {") or dst is not None:
                continue
            rid = json.loads(line[6:])["id"]
            src = where_is(instances, rid)
            if src is None:
                continue
            dst = next(i for i in instances if i != src)
            report = ray.get(instances[src].migrate_request.remote(rid, dst, instances[dst]), timeout=60)
            assert report["committed"], report
    assert rid is not None and dst is not None
    return rid, dst


def test_metrics_and_request_lines_of_a_real_cluster(tmp_path_factory, caplog):
    from tests.cluster.helpers import ADMIN, running_cluster, serve_cluster
    from tests.tiny_model import save_tiny_llama

    caplog.set_level(logging.INFO, logger="llumnix.gateway.request_log")
    model = tmp_path_factory.mktemp("tiny-metrics-model")
    save_tiny_llama(model)
    engine = {"num_blocks": 256, "enable_prefix_caching": True}
    with running_cluster(model, "metrics", instances=2, engine=engine) as cluster, \
            serve_cluster(cluster, model) as (url, _):
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": name, "prompt": "the same prompt, twice over " * 3, "max_tokens": 8, "ignore_eos": True}
        for _ in range(2):
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        rid, dst = _stream_migrating_once(url, {**body, "prompt": "move me", "max_tokens": 200}, cluster.instances)
        time.sleep(0.3)  # the instances' next status reports
        text = httpx.get(f"{url}/metrics").text
        info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric, kind in {**DASHBOARD, **OURS}.items():
        assert families[metric].type == kind, metric
    engines = {s.labels["engine"] for s in families["vllm:num_requests_running"].samples}
    assert engines == set(cluster.instances)  # one series per instance

    def total(metric: str, **labels: str) -> float:
        return sum(s.value for s in families[metric].samples
                   if s.name == f"{metric}_total" and all(s.labels.get(k) == v for k, v in labels.items()))

    # LlumSched's counts (the migration above was ordered by hand, not by LlumSched)
    assert total("llumnix:migrations", outcome="committed") == info["migrations"]["committed"]
    assert total("llumnix:dispatches") == info["num_dispatched"] >= 3
    assert total("vllm:request_success") == 3
    assert total("vllm:prefix_cache_hits") > 0  # the repeated prompt, on whichever instance
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Finished request {rid}:")]
    assert len(lines) == 1, lines
    assert re.search(rf"instance={dst} .*output_tokens=200 finish_reason=length .*migrations=1$", lines[0]), lines
