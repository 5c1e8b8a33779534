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
FAULTS = ("garbage", "oversized", "token_id", "usage", "max_tokens")
"""The kinds of ``LiteBackend.engine_faults``, each a series from the start."""


class LiteCollector(Collector):
    def __init__(self, backends: list[LiteBackend], model_name: str, mixed: Any = None) -> None:
        self.backends = backends
        self.model_name = model_name
        self.mixed = mixed
        """A ``MixedBackend`` whose fallbacks and resumes between pools count too."""

    def collect(self) -> Iterator[Metric]:
        now, name = time.time(), self.model_name
        healthy = GaugeMetricFamily("llumnix:endpoint_healthy", "1 while an endpoint takes requests (not "
                                    "ejected by its health checks, not drained).", labels=_LABELS)
        age = GaugeMetricFamily("llumnix:endpoint_scrape_age_seconds", "Age of the endpoint's last metrics "
                                "scrape (absent: it has no metrics).", labels=_LABELS)
        flight = GaugeMetricFamily("llumnix:endpoint_requests_in_flight", "Requests this gateway has in "
                                   "flight on the endpoint (its local real-time state).", labels=_LABELS)
        ejections = CounterMetricFamily("llumnix:endpoint_ejections", "Times the endpoint was ejected.",
                                        labels=_LABELS)
        endpoints = {i: e for b in self.backends for i, e in b.endpoints.items()}
        for iid, ep in sorted(endpoints.items()):
            labels = [name, iid, ep.pool]
            healthy.add_metric(labels, float(ep.can_serve()))
            if ep.lrs.load is not None:
                age.add_metric(labels, now - ep.lrs.load.timestamp)
            flight.add_metric(labels, float(ep.lrs.num_in_flight))
            ejections.add_metric(labels, float(ep.health.num_ejections))
        yield from (healthy, age, flight, ejections)
        bs, mixed = self.backends, self.mixed
        fallbacks, resumed = (mixed.num_fallbacks, mixed.num_resumed) if mixed is not None else (0, 0)
        for value, metric, doc in ((sum(b.num_retries for b in bs), "llumnix:lite_retries",
                                    "Requests sent to another endpoint after theirs failed before any output."),
                                   (fallbacks + sum(b.num_fallbacks for b in bs), "llumnix:lite_fallbacks",
                                    "Requests served by a pool other than their first choice."),
                                   (resumed + sum(b.num_resumed for b in bs), "llumnix:lite_resumed",
                                    "Requests resumed on another endpoint after theirs failed mid-stream."),
                                   (sum(b.num_failed_mid_stream for b in bs), "llumnix:lite_failed_mid_stream",
                                    "Requests whose endpoint failed after they had streamed output.")):
            fam = CounterMetricFamily(metric, doc, labels=["model_name"])
            fam.add_metric([name], float(value))
            yield fam
        faults = CounterMetricFamily("llumnix:lite_engine_faults", "Answers no sane engine gives, by kind: garbage, "
                                     "oversized (a line, reply or headers past their cap), token_id (outside the "
                                     "vocabulary), usage (impossible figures), max_tokens (output past it, cut).",
                                     labels=["model_name", "fault"])
        for fault in FAULTS:
            faults.add_metric([name, fault], float(sum(b.engine_faults[fault] for b in bs)))
        yield faults


def install(app: Any, backend: Any) -> None:
    """Add the lite series to the registry of a gateway app built over ``backend``: a
    ``LiteBackend``, or a ``MixedBackend`` whose external pools are (the fallbacks and
    resumes between its pools count with theirs)."""
    members = getattr(backend, "members", None)
    if members is None:
        collector = LiteCollector([backend], backend.model_name)
    else:
        lites = [m.backend for m in members.values() if isinstance(m.backend, LiteBackend)]
        collector = LiteCollector(lites, backend.model_name, mixed=backend)
    app.state.gateway.metrics.registry.register(collector)
