"""One external endpoint: its books (LRS), its health, and the two loops that watch it:
an active probe (``GET /v1/models``, which also says the engine's model name and
context) and a metrics scrape (``GET /metrics``; the engine kind is read off the first
page when not configured, and an engine without metrics is not scraped again)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx
import orjson

from llumnix.lite.config import EndpointConfig, LiteConfig
from llumnix.lite.health import EndpointHealth, HealthOptions
from llumnix.lite.lrs import LocalState
from llumnix.lite.scrape import detect_kind, parse_metrics

log = logging.getLogger(__name__)

MAX_MODELS_BYTES = 1 << 20
"""The longest ``/v1/models`` answer read (a longer one fails the probe)."""
MAX_METRICS_BYTES = 8 << 20
"""The longest metrics page read (a longer one is skipped)."""


class Endpoint:
    def __init__(self, cfg: EndpointConfig, pool: str, lite: LiteConfig, changed: set[str] | None = None) -> None:
        self.cfg = cfg
        self.endpoint_id = cfg.name
        self.pool = pool
        self.kind = cfg.kind
        """The engine kind; 'auto' until its metrics (or their absence) say."""
        self.model = cfg.model
        self.models: tuple[str, ...] = ()
        """Every model name the engine's /v1/models lists (learnt by the probe)."""
        self.max_model_len: int | None = None
        self.changed: set[str] = set() if changed is None else changed
        """Where its books and its health changes add its id (its pool's set)."""
        self.lrs = LocalState(cfg.name, cfg.capacity_tokens, cfg.max_num_seqs,
                              max_scrape_age_s=max(2.0, 4 * lite.scrape_interval_s), changed=self.changed)
        self.health = EndpointHealth(HealthOptions(lite.eject_after, lite.backoff_s, lite.max_backoff_s))
        self._is_drained = False
        self.headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self._lite = lite
        self._scrapes = cfg.kind != "openai"

    @property
    def url(self) -> str:
        return self.cfg.url

    @property
    def is_drained(self) -> bool:
        """An operator's drain: no new requests (those in flight finish)."""
        return self._is_drained

    def set_drained(self, drained: bool) -> None:
        self._is_drained = drained
        self.changed.add(self.endpoint_id)

    def can_serve(self) -> bool:
        return self.health.can_serve() and not self._is_drained

    def on_request_failed(self, error: str, refused: bool) -> None:
        if self.health.on_failure(time.time(), error, fatal=refused):
            self.changed.add(self.endpoint_id)
            log.warning("lite: endpoint %s ejected: %s", self.endpoint_id, error)

    def on_probe(self, ok: bool, now: float, error: str = "") -> None:
        """A probe's answer: the health's verdict, and dispatch told when it changed."""
        could = self.health.can_serve()
        if self.health.on_probe(ok, now, error):
            log.warning("lite: endpoint %s re-admitted", self.endpoint_id)
        if self.health.can_serve() != could:
            self.changed.add(self.endpoint_id)
            if could:
                log.warning("lite: endpoint %s ejected: %s", self.endpoint_id, self.health.last_error)

    def engine_model(self, model: str) -> str:
        """The name to send for a request naming ``model``: itself where the engine lists
        it, else the endpoint's own model (a pool's name for it), else itself."""
        return model if model in self.models or not self.model else self.model

    # -- watching -----------------------------------------------------------------------
    async def probe(self, client: httpx.AsyncClient) -> bool:
        """One active probe; learns the engine's model name and context on success.

        A probe that connected but got no answer in time counts for nothing: a busy
        engine answers probes late (llama-cpp-python's server while it generates, even
        for other clients), and ejecting it piles its requests onto the others; a hung
        one fails the requests themselves (``first_byte_timeout_s``, retried elsewhere,
        then ejected). Refused or timed-out connections and error answers count."""
        try:
            status, page = await self._get(client, "/v1/models", self._lite.connect_timeout_s + 2.0, MAX_MODELS_BYTES)
            ok = status == 200
            error = "" if ok else f"probe: HTTP {status}"
            if ok:
                self._learn(orjson.loads(page))
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
            return False
        except (httpx.HTTPError, ValueError) as e:
            ok, error = False, f"probe: {type(e).__name__}: {e}"
        self.on_probe(ok, time.time(), error)
        return ok

    def _learn(self, models: Any) -> None:
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return
        self.models = tuple(str(m.get("id", "")) for m in data if isinstance(m, dict) and m.get("id"))
        if not self.model:
            self.model = str(data[0].get("id", ""))
        mine = next((m for m in data if isinstance(m, dict) and m.get("id") == self.model), data[0])
        n = mine.get("max_model_len")
        if type(n) is int and n > 0:
            self.max_model_len = n

    async def scrape(self, client: httpx.AsyncClient) -> None:
        if not self._scrapes:
            return
        try:
            status, page = await self._get(client, "/metrics", 2.0, MAX_METRICS_BYTES)
        except (httpx.HTTPError, ValueError):
            return  # the probe judges health; a scrape only informs
        if status == 404:
            self._scrapes = False  # an engine without metrics: the books alone
            self.kind = "openai" if self.kind == "auto" else self.kind
            return
        if status != 200:
            return
        text = page.decode(errors="replace")
        if self.kind == "auto":
            self.kind = detect_kind(text)
            log.info("lite: endpoint %s is %s", self.endpoint_id, self.kind)
        with contextlib.suppress(ValueError):  # a page that does not parse is skipped
            self.lrs.on_scrape(parse_metrics(self.kind, text, time.time()))

    async def _get(self, client: httpx.AsyncClient, path: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
        """GET ``path``: its status and body, read no further than ``max_bytes`` (a longer
        body is a ValueError)."""
        async with client.stream("GET", self.url + path, headers=self.headers, timeout=timeout_s) as resp:
            body = bytearray()
            async for piece in resp.aiter_bytes():
                body += piece
                if len(body) > max_bytes:
                    raise ValueError(f"{path} is over {max_bytes} bytes")
            return resp.status_code, bytes(body)

    async def watch(self, client: httpx.AsyncClient) -> None:
        """Probe and scrape until cancelled."""
        next_probe = 0.0
        while True:
            now = time.monotonic()
            if now >= next_probe:
                await self.probe(client)
                next_probe = time.monotonic() + self._lite.probe_interval_s
            await self.scrape(client)
            await asyncio.sleep(min(self._lite.scrape_interval_s, max(0.0, next_probe - time.monotonic())))

    def summary(self, now: float) -> dict[str, Any]:
        return {"url": self.url, "pool": self.pool, "kind": self.kind, "model": self.model,
                "is_drained": self.is_drained, "health": self.health.summary(now), "lrs": self.lrs.summary(now)}
