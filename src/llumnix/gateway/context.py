"""The gateway's configuration and the state its routes share (``app.state.gateway``)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from starlette.requests import Request

from llumnix.gateway.backend import Backend
from llumnix.gateway.formatting import LogprobFormat
from llumnix.gateway.metrics import GatewayMetrics


@dataclass(frozen=True)
class GatewayConfig:
    api_key: str | None = None
    """When set, /v1/*, /tokenize and /detokenize need 'Authorization: Bearer KEY'."""
    admin_requires_key: bool = False
    """Refuse /admin/* (403) when no API key is set: the server listens beyond loopback."""
    default_max_tokens: int = 256
    """max_tokens of a request that names none (shrunk to what the context leaves)."""


@dataclass
class GatewayContext:
    backend: Backend
    config: GatewayConfig
    metrics: GatewayMetrics

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
