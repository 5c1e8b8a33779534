"""Internal and external pools under one gateway, for real: `llumnix serve --config` with
an internal pool (one Ray instance of the tiny random model, full mode) and an external
pool of an HTTP fake engine, each falling back to the other."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from llumnix.cluster.startup import free_port
from tests.lite.conftest import wait_healthy
from tests.lite.fake_engine import FakeEngine

pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, FakeEngine]]:
    """(the gateway's url, the internal pool's model name, the external engine)."""
    from tests.tiny_model import save_tiny_llama

    model_dir = tmp_path_factory.mktemp("tiny-mixed-model")
    save_tiny_llama(model_dir)
    engine = FakeEngine(model="ext-model").start()
    work = tmp_path_factory.mktemp("mixed")
    config = work / "mixed.yaml"
    config.write_text(yaml.safe_dump({
        "model": str(model_dir),
        "pools": [{"name": "ours", "internal": True, "fallback": "ext"},
                  {"name": "ext", "models": ["ext-*"], "fallback": "ours",
                   "endpoints": [{"url": engine.url, "kind": "openai"}]}],
        "lite": {"probe_interval_s": 0.2, "backoff_s": 0.5}}))
    port, log = free_port(), work / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "serve", "--config", str(config), "--instances", "1",
                             "--kv-cache-mib", "8", "--port", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url, model_dir.name, engine
    finally:
        engine.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _complete(url: str, model: str) -> Any:
    r = httpx.post(url + "/v1/completions", timeout=60,
                   json={"model": model, "prompt": "hello", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def _dispatched(url: str) -> int:
    info = httpx.get(url + "/admin/cluster", timeout=10).json()
    ours = next(p for p in info["pools"] if p["name"] == "ours")
    return int(ours["info"]["num_dispatched"])


def test_each_model_is_served_by_its_pool_and_ext_falls_back_to_ours_when_its_engine_dies(mixed):
    url, ours, engine = mixed
    names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
    assert names == [ours, "ext-model"]
    assert httpx.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404

    before = _dispatched(url)
    assert _complete(url, ours)["usage"]["completion_tokens"] == 5
    assert _dispatched(url) == before + 1 and engine.bodies == []

    assert _complete(url, "ext-model")["choices"][0]["text"] == " alpha beta gamma delta epsilon"
    assert _complete(url, "ext-large")["usage"]["completion_tokens"] == 5  # by prefix; the engine's own name
    assert [b["model"] for b in engine.bodies] == ["ext-model", "ext-model"]
    assert _dispatched(url) == before + 1

    engine.stop()  # the external pool dies: its models are served by our instances
    for _ in range(3):
        assert _complete(url, "ext-model")["usage"]["completion_tokens"] == 5
    assert _dispatched(url) == before + 4 and len(engine.bodies) == 2
    metrics = httpx.get(url + "/metrics").text
    assert 'llumnix:lite_fallbacks_total{model_name="' + ours + '"} 3.0' in metrics
