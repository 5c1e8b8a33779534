"""Prometheus metrics of the gateway: vLLM names where they exist, ours beside them."""
from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)


class GatewayMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.requests = Counter("vllm:request_success", "Finished requests by finish reason.",
                                labels + ["finished_reason"], registry=r)
        self.aborted = Counter("llumnix:requests_aborted", "Requests aborted before finishing "
                               "(client gone, or an error).", labels, registry=r)
        self.rejected = Counter("llumnix:requests_rejected", "Requests refused with a 4xx.",
                                labels + ["status"], registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", labels,
                                     registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels,
                                         registry=r)
        self.prompt_tokens_cached = Counter("llumnix:prompt_tokens_cached", "Prompt tokens of finished "
                                            "requests whose KV came from an instance's prefix cache.",
                                            labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token.",
                              labels, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
                              registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("llumnix:gateway_requests_in_flight", "Requests being served.",
                               labels, registry=r)
        self.freeness = Gauge("llumnix:instance_freeness", "Freeness of each instance (Algorithm 1).",
                              labels + ["instance_id"], registry=r)
        self.instance_running = Gauge("llumnix:instance_num_running", "Running requests per instance.",
                                      labels + ["instance_id"], registry=r)
        self.instance_kv_usage = Gauge("vllm:gpu_cache_usage_perc", "KV blocks in use per instance.",
                                       labels + ["instance_id"], registry=r)
        self.dispatched = Gauge("llumnix:dispatch_decisions", "Requests dispatched by LlumSched.",
                                labels, registry=r)
        self.migrations = Gauge("llumnix:migrations", "Migrations by outcome since start.",
                                labels + ["outcome"], registry=r)
        self.downtime = Histogram("llumnix:migration_downtime_seconds", "Downtime of committed migrations.",
                                  labels, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                                  registry=r)
        self.instance_outcomes = Gauge("llumnix:gateway_instances_lost",
                                       "Instances this gateway stopped polling, by how they ended "
                                       "(failed: its requests were resumed elsewhere; retired: "
                                       "drained and stopped by scale-in).",
                                       labels + ["outcome"], registry=r)
        self.resumed = Gauge("llumnix:gateway_requests_resumed",
                             "Requests resumed on another instance after theirs failed.", labels, registry=r)
        self._downtimes_seen = 0
        self._instance_ids: set[str] = set()
        self.model_name = model_name

    def observe_cluster(self, info: dict) -> None:  # type: ignore[type-arg]
        """Refresh the cluster gauges from LlumSched's /admin/cluster view."""
        name = self.model_name
        per_instance = (self.freeness, self.instance_running, self.instance_kv_usage)
        ids = set()
        for inst in info.get("instances", []):
            iid = inst["instance_id"]
            ids.add(iid)
            self.freeness.labels(model_name=name, instance_id=iid).set(inst["freeness"])
            self.instance_running.labels(model_name=name, instance_id=iid).set(inst["num_running"])
            self.instance_kv_usage.labels(model_name=name, instance_id=iid).set(
                inst["num_used_blocks"] / max(1, inst["num_total_blocks"]))
        for gone in self._instance_ids - ids:  # scaled in or failed: no frozen last values
            for gauge in per_instance:
                gauge.remove(name, gone)
        self._instance_ids = ids
        gw = info.get("gateway")
        if gw:
            self.instance_outcomes.labels(model_name=name, outcome="failed").set(gw["num_failed_instances"])
            self.instance_outcomes.labels(model_name=name, outcome="retired").set(gw["num_retired_instances"])
            self.resumed.labels(model_name=name).set(gw["num_resumed"])
        if "num_dispatched" in info:
            self.dispatched.labels(model_name=name).set(info["num_dispatched"])
        mig = info.get("migrations")
        if mig:
            self.migrations.labels(model_name=name, outcome="committed").set(mig["committed"])
            self.migrations.labels(model_name=name, outcome="aborted").set(mig["aborted"])
            # LlumSched keeps the last HISTORY downtimes; observe those committed since the
            # last scrape (a LlumSched restart starts the count again).
            num_new = mig.get("committed_running", 0) - self._downtimes_seen
            recent = mig.get("recent_downtimes_s", [])
            for d in recent[len(recent) - min(num_new, len(recent)):] if num_new > 0 else ():
                self.downtime.labels(model_name=name).observe(d)
            self._downtimes_seen = mig.get("committed_running", 0)

    def labels(self, metric: M) -> M:
        return metric.labels(model_name=self.model_name)
