"""Prometheus metrics of the gateway: vLLM names where they exist, ours beside them."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token.",
                              labels, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
                              registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("llumnix:gateway_requests_in_flight", "Requests being served.",
                               labels, registry=r)
        self.model_name = model_name

    def labels(self, metric):  # type: ignore[no-untyped-def]
        return metric.labels(model_name=self.model_name)
