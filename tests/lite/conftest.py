from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from llumnix.gateway.inprocess import InProcessGateway
from llumnix.lite.backend import LiteBackend
from llumnix.lite.config import EndpointConfig, LiteConfig, PoolConfig
from tests.gateway.fake_backend import chatml_tokenizer
from tests.lite.fake_engine import FakeEngine

FAST = {"connect_timeout_s": 1.0, "first_byte_timeout_s": 1.5, "idle_timeout_s": 1.5,
        "probe_interval_s": 0.1, "scrape_interval_s": 0.1, "backoff_s": 0.3}


@pytest.fixture()
def engines() -> Iterator[Any]:
    """``engines(mode, ...)`` starts a fake engine; all are stopped at the end."""
    started: list[FakeEngine] = []

    def make(mode: str = "ok", **kw: Any) -> FakeEngine:
        e = FakeEngine(mode, **kw).start()
        started.append(e)
        return e

    yield make
    for e in started:
        e.stop()


def lite_backend(pools: list[tuple[str, list[FakeEngine], dict[str, Any]]], kind: str = "openai",
                 **settings: Any) -> LiteBackend:
    """A LiteBackend over (pool name, engines, pool fields) with fast timeouts."""
    cfg = LiteConfig(pools=tuple(PoolConfig(name, tuple(EndpointConfig(e.url, name=f"{name}-{i}", kind=kind)
                                                        for i, e in enumerate(engs)), **fields)
                                 for name, engs, fields in pools), **{**FAST, **settings})
    return LiteBackend(cfg, chatml_tokenizer(), "fake-model", vocab_size=258, max_model_len=4096)


@contextlib.contextmanager
def gateway(backend: LiteBackend) -> Iterator[str]:
    with InProcessGateway(backend) as url:
        yield url
