from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llumnix.cluster.startup import free_port, wait_until_healthy
from llumnix.core.errors import LlumnixError
from llumnix.lite.app import lite_app
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
                 model_name: str = "fake-model", **settings: Any) -> LiteBackend:
    """A LiteBackend over (pool name, engines, pool fields) with fast timeouts."""
    cfg = LiteConfig(pools=tuple(PoolConfig(name, tuple(EndpointConfig(e.url, name=f"{name}-{i}", kind=kind)
                                                        for i, e in enumerate(engs)), **fields)
                                 for name, engs, fields in pools), **{**FAST, **settings})
    return LiteBackend(cfg, chatml_tokenizer(), model_name, vocab_size=258, max_model_len=4096)


@contextlib.contextmanager
def gateway(backend: Any) -> Iterator[str]:
    """The app `llumnix serve` builds in lite mode (``lite_app``), served by uvicorn in a
    thread on a free loopback port."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(lite_app(backend), host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="lite-gateway")
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        assert server.started, "the lite gateway did not start within 30 s"
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180) -> None:
    """Until ``url``/health answers 200; fails with the log's tail if the process exits or time runs out."""
    try:
        wait_until_healthy(url, proc, timeout_s)
    except LlumnixError as e:
        pytest.fail(f"{e}\n{log.read_text()[-2000:]}")
