"""Lite mode's own series on the gateway's ``/metrics``, beside the per-instance ones the
gateway serves from ``cluster_info`` (running, waiting, KV usage, freeness): each
endpoint's health, scrape age and requests in flight, and the retries and fallbacks."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llumnix.lite.backend import LiteBackend

_LABELS = ["model_name", "endpoint", "pool"]


class LiteCollector(Collector):
    def __init__(self, backend: LiteBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        b, now, name = self.backend, time.time(), self.backend.model_name
        healthy = GaugeMetricFamily("llumnix:endpoint_healthy", "1 while an endpoint takes requests (not "
                                    "ejected by its health checks, not drained).", labels=_LABELS)
        age = GaugeMetricFamily("llumnix:endpoint_scrape_age_seconds", "Age of the endpoint's last metrics "
                                "scrape (absent: it has no metrics).", labels=_LABELS)
        flight = GaugeMetricFamily("llumnix:endpoint_requests_in_flight", "Requests this gateway has in "
                                   "flight on the endpoint (its local real-time state).", labels=_LABELS)
        ejections = CounterMetricFamily("llumnix:endpoint_ejections", "Times the endpoint was ejected.",
                                        labels=_LABELS)
        for iid, ep in sorted(b.endpoints.items()):
            labels = [name, iid, ep.pool]
            healthy.add_metric(labels, float(ep.can_serve()))
            if ep.lrs.load is not None:
                age.add_metric(labels, now - ep.lrs.load.timestamp)
            flight.add_metric(labels, float(ep.lrs.num_in_flight))
            ejections.add_metric(labels, float(ep.health.num_ejections))
        yield from (healthy, age, flight, ejections)
        for value, metric, doc in ((b.num_retries, "llumnix:lite_retries",
                                    "Requests sent to another endpoint after theirs failed before any output."),
                                   (b.num_fallbacks, "llumnix:lite_fallbacks",
                                    "Requests served by a pool other than their first choice."),
                                   (b.num_resumed, "llumnix:lite_resumed",
                                    "Requests resumed on another endpoint after theirs failed mid-stream."),
                                   (b.num_failed_mid_stream, "llumnix:lite_failed_mid_stream",
                                    "Requests whose endpoint failed after they had streamed output.")):
            fam = CounterMetricFamily(metric, doc, labels=["model_name"])
            fam.add_metric([name], float(value))
            yield fam


def install(app: Any, backend: LiteBackend) -> None:
    """Add the lite series to the registry of a gateway app built over ``backend``."""
    app.state.gateway.metrics.registry.register(LiteCollector(backend))
