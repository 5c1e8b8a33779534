"""Prometheus metrics of the gateway: vLLM's names, types and buckets (vLLM v1, 0.11 on)
where vLLM has the metric, ``llumnix:*`` for what is ours.

The gateway measures requests (cluster-wide: every request of this gateway, whichever
instance served it); the instances' state and the cumulative counts of the instances and
LlumSched come from the cluster view each scrape reads (``cluster_metrics``)."""
from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import HistogramMetricFamily

from llumnix.core.batch import RequestMetrics
from llumnix.gateway.cluster_metrics import ClusterCollector

M = TypeVar("M", bound=MetricWrapperBase)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0)
"""vLLM's buckets of the inter-token latency and of a request's time per output token."""
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vLLM's buckets of end-to-end, queue, prefill, decode and inference time."""


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class RequestHistogram:
    """One labelled histogram the request path observes: a bisect and two additions, no
    lock (the gateway observes on its event loop), ``n`` equal observations at once.
    prometheus_client's ``Histogram.observe`` takes a lock per value and scans the
    buckets in Python: ~15 us a call, a tenth of the gateway's CPU per request. Exported
    by ``RequestHistograms`` at scrape time with the same name, buckets and samples."""

    __slots__ = ("name", "doc", "bounds", "counts", "sum", "created")

    def __init__(self, name: str, doc: str, buckets: Any) -> None:
        self.name, self.doc = name, doc
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n


class RequestHistograms:
    """The collector of the ``RequestHistogram``s: Prometheus histograms (cumulative
    buckets, count, sum, created) labelled with the model's name."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.hists: list[RequestHistogram] = []

    def add(self, hist: RequestHistogram) -> RequestHistogram:
        self.hists.append(hist)
        return hist

    def collect(self) -> Iterator[HistogramMetricFamily]:
        labels = [self.model_name]
        for h in self.hists:
            cum = list(accumulate(list(h.counts)))
            fam = HistogramMetricFamily(h.name, h.doc, labels=["model_name"])
            bounds = [str(b) for b in h.bounds] + ["+Inf"]
            fam.add_metric(labels, list(zip(bounds, map(float, cum), strict=True)), h.sum)
            fam.add_sample(h.name + "_created", {"model_name": self.model_name}, h.created)
            yield fam


class GatewayMetrics:
    def __init__(self, model_name: str, max_model_len: int = 1 << 17) -> None:
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        histograms = RequestHistograms(model_name)

        def hist(name: str, doc: str, buckets: Any) -> RequestHistogram:
            return histograms.add(RequestHistogram(name, doc, buckets))

        def count(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        self.requests = Counter("vllm:request_success", "Count of successfully processed requests.",
                                labels + ["finished_reason"], registry=r)
        self.aborted = Counter("llumnix:requests_aborted", "Requests aborted before finishing "
                               "(client gone, or an error).", labels, registry=r)
        self.rejected = Counter("llumnix:requests_rejected", "Requests refused with a 4xx.",
                                labels + ["status"], registry=r)
        self.slo_requests = Counter("llumnix:slo_requests", "Finished requests per SLO class (scheduling.slo).",
                                    labels + ["slo_class"], registry=r)
        self.slo_met = Counter("llumnix:slo_met", "Finished requests that met both their SLO class's TTFT "
                               "and TPOT objectives (attainment: this over llumnix:slo_requests).",
                               labels + ["slo_class"], registry=r)
        self.prompt_tokens = count("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = count("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prompt_tokens_cached = count("llumnix:prompt_tokens_cached", "Prompt tokens of finished "
                                          "requests whose KV came from an instance's prefix cache.")
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        TOKEN_LATENCY_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", TOKEN_LATENCY_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference_time = hist("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   REQUEST_LATENCY_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                          token_buckets)
        self.request_generation_tokens = hist("vllm:request_generation_tokens",
                                              "Number of generation tokens processed.", token_buckets)
        self.params_max_tokens = hist("vllm:request_params_max_tokens",
                                      "Histogram of the max_tokens request parameter.", token_buckets)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
        self.in_flight = Gauge("llumnix:gateway_requests_in_flight", "Requests being served.",
                               labels, registry=r)
        self.downtime = hist("llumnix:migration_downtime_seconds", "Downtime of committed migrations.",
                             (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        r.register(histograms)
        self.cluster = ClusterCollector(model_name)
        r.register(self.cluster)
        self._downtimes_seen = 0
        self._children: dict[tuple[Any, ...], Any] = {}

    def labels(self, metric: M, *more: str) -> M:
        """``metric``'s child for this model (and ``more`` label values), kept: the
        library's ``labels`` costs a lock and a tuple lookup each call."""
        key = (id(metric), *more)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, *more)
        return child

    def observe_slo(self, slo_class: str, met: bool) -> None:
        """A finished request of ``slo_class``, and whether it met both its objectives."""
        self.slo_requests.labels(self.model_name, slo_class).inc()
        if met:
            self.slo_met.labels(self.model_name, slo_class).inc()

    def observe_finished(self, m: RequestMetrics | None, num_prompt_tokens: int, num_output_tokens: int,
                         ttft: float | None, decode: float | None, e2e: float | None) -> None:
        """A finished request: its tokens, and its times (``ttft``, ``decode`` and ``e2e``
        seen by the gateway; queue and prefill time on the instance's clock)."""
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_output_tokens)
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)
        if e2e is not None:
            self.e2e.observe(e2e)
        if ttft is not None and e2e is not None:
            # vLLM's rule: a request of at most one output token counts as 0
            self.tpot.observe((e2e - ttft) / (num_output_tokens - 1) if num_output_tokens > 1 else 0.0)
        if decode is not None:
            self.decode_time.observe(decode)
        if m is None:
            return
        self.prompt_tokens_cached.inc(m.num_cached_tokens)
        if m.queue_time is not None:
            self.queue_time.observe(max(0.0, m.queue_time))
        if m.first_token_time is not None and m.first_scheduled_time is not None:
            prefill = max(0.0, m.first_token_time - m.first_scheduled_time)
            self.prefill_time.observe(prefill)
            if decode is not None:
                self.inference_time.observe(prefill + decode)

    def requests_summary(self) -> dict[str, Any]:
        """The requests part of ``/admin/cluster`` (the dashboard's rates and percentiles):
        cumulative counts the reader differences over its own window, as Prometheus does."""
        done = self.request_generation_tokens
        return {"time": time.time(), "num_finished": sum(done.counts), "num_output_tokens": done.sum,
                "ttft": {"bounds": self.ttft.bounds, "counts": self.ttft.counts},
                "itl": {"bounds": self.itl.bounds, "counts": self.itl.counts}}

    def observe_cluster(self, info: dict[str, Any] | None) -> None:
        """Take the cluster view (``/admin/cluster``) the scrape serves; ``None`` when it
        could not be read (no cluster series then, rather than stale ones)."""
        self.cluster.update(info)
        mig = (info or {}).get("migrations")
        if not mig:
            return
        # LlumSched keeps the last HISTORY downtimes; observe those committed since the
        # last scrape (a LlumSched restart starts the count again).
        num_new = mig.get("committed_running", 0) - self._downtimes_seen
        recent = mig.get("recent_downtimes_s", [])
        for d in recent[len(recent) - min(num_new, len(recent)):] if num_new > 0 else ():
            self.downtime.observe(d)
        self._downtimes_seen = mig.get("committed_running", 0)
