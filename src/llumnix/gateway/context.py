"""The gateway's configuration and the state its routes share (``app.state.gateway``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from starlette.requests import Request

from llumnix.gateway.backend import Backend
from llumnix.gateway.cluster_watch import ClusterWatch
from llumnix.gateway.fair import FairGate
from llumnix.gateway.formatting import LogprobFormat
from llumnix.gateway.metrics import GatewayMetrics
from llumnix.gateway.request_log import RequestLog
from llumnix.policy.fair_share import FairConfig
from llumnix.policy.slo import SLOConfig


@dataclass(frozen=True)
class GatewayConfig:
    api_key: str | None = None
    """When set, /v1/*, /tokenize and /detokenize need 'Authorization: Bearer KEY'."""
    admin_key: str | None = None
    """When set, every /admin/* route needs 'Authorization: Bearer KEY'; when not, the
    routes that change the cluster (drain, undrain) are off and /admin/cluster is read
    under the API key's rules."""
    admin_requires_key: bool = False
    """Refuse /admin/cluster (403) when neither key is set: the server listens beyond loopback."""
    default_max_tokens: int = 256
    """max_tokens of a request that names none (shrunk to what the context leaves)."""
    max_request_bytes: int | Literal["auto"] | None = "auto"
    """Larger request bodies get a 413 before they are parsed (None: no limit; 'auto': 64
    bytes a token of context, at least 512 KiB: ``limits.body_limit``)."""
    offload_bytes: int = 16 << 10
    """Texts of more UTF-8 bytes than this (token lists of a quarter as many tokens) are
    tokenized (detokenized) in a worker thread, so the event loop keeps serving."""
    log_requests: bool = True
    """One INFO line per finished request (``--disable-log-requests`` turns it off)."""
    log_stats: bool = True
    """A throughput line every ``log_stats_interval_s`` while there is traffic
    (``--disable-log-stats`` turns it off)."""
    log_stats_interval_s: float = 10.0
    """Seconds between the throughput lines logged while there is traffic."""
    http_read_timeout_s: float = 30.0
    """A request's headers and body must arrive within this many seconds of its first byte
    (of the connection's opening, for its first request), or the connection is closed
    (``read_deadline.py``)."""
    private_docs_and_metrics: bool = False
    """/metrics, /docs, /redoc and /openapi.json need the API key too (when one is set)."""
    model_root: str | None = None
    """The model the served name stands for (/v1/models' ``root``); None: the served name."""
    fair_share: int | None = None
    """At most this many choices in flight from this gateway, the rest waiting in a per-client
    virtual-token-counter queue (``gateway/fair.py``); None: every choice goes at once."""
    slo: SLOConfig = field(default_factory=SLOConfig)
    """The SLO classes a request may name (``slo_class``), and ``/metrics``' ``llumnix:slo_*``
    count against (the system's ``scheduling.slo``; the defaults for ``llumnix gateway``)."""


@dataclass
class GatewayContext:
    backend: Backend
    config: GatewayConfig
    metrics: GatewayMetrics
    request_log: RequestLog = field(init=False)
    fair: FairGate | None = field(init=False)
    cluster_watch: ClusterWatch = field(init=False)
    """The view ``/admin/cluster?after=`` long polls wait on."""

    def __post_init__(self) -> None:
        n = self.config.fair_share
        self.fair = None if n is None else FairGate(FairConfig(max_in_flight=n))
        self.request_log = RequestLog(self.config.log_requests, self.config.log_stats_interval_s,
                                      log_stats=self.config.log_stats)
        self.cluster_watch = ClusterWatch(self.backend)

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    def token_text(self, token_id: int) -> str:
        return self.backend.tokenizer.decode([token_id], skip_special_tokens=False)

    @cached_property
    def _formats(self) -> tuple[LogprobFormat, LogprobFormat]:
        return LogprobFormat(self.token_text), LogprobFormat(self.token_text, as_ids=True)

    def logprob_format(self, as_ids: bool) -> LogprobFormat:
        return self._formats[as_ids]

    def reject(self, status: int) -> None:
        """Count a request refused with a 4xx."""
        self.metrics.rejected.labels(model_name=self.model_name, status=str(status)).inc()


def context(request: Request) -> GatewayContext:
    ctx: GatewayContext = request.app.state.gateway
    return ctx
