"""``MixedBackend``: an internal pool (here an engine core stepped in this process, the
gateway tests' backend; tests/lite/test_mixed_cluster.py has our real Ray instances)
beside an external pool of a real HTTP fake engine, under one gateway."""
from __future__ import annotations

import json
from typing import Any

import httpx

from llumnix.core.errors import LlumnixError
from llumnix.lite.backend import LiteBackend
from llumnix.lite.config import EndpointConfig, LiteConfig, PoolConfig
from llumnix.lite.mixed import Member, MixedBackend
from tests.gateway.fake_backend import EngineBackend
from tests.lite.conftest import FAST, gateway


class CountingBackend(EngineBackend):
    def __init__(self) -> None:
        super().__init__()
        self.served: list[str] = []

    async def generate(self, request: Any) -> Any:
        self.served.append(request.request_id)
        async for out in super().generate(request):
            yield out


class DownBackend(EngineBackend):
    """An internal pool with no instance serving."""

    async def health(self) -> dict[str, Any]:
        return {"status": "unavailable", "instances": {"i0": False}, "serving": [], "target": 1}

    async def generate(self, request: Any) -> Any:
        raise LlumnixError("no instance is available to serve the request")
        yield  # an async generator, as the real one


def _mixed(engine: Any, internal: EngineBackend | None = None, ext_fallback: str | None = "ours",
           ours_fallback: str | None = "ext") -> tuple[MixedBackend, EngineBackend]:
    internal = internal or CountingBackend()
    ext_pool = PoolConfig("ext", (EndpointConfig(engine.url, name="ext-0", kind="openai"),), ("ext-model",),
                          fallback=ext_fallback)
    ext = LiteBackend(LiteConfig(pools=(PoolConfig("ext", ext_pool.endpoints, ext_pool.models),), **FAST),
                      internal.tokenizer, "ext-model", vocab_size=internal.vocab_size, max_model_len=256)
    members = [Member(PoolConfig("ours", (), ("fake",), fallback=ours_fallback, internal=True), internal),
               Member(ext_pool, ext)]
    return MixedBackend(members, internal.tokenizer, "fake", internal.vocab_size, health_interval_s=0.1), internal


def _complete(url: str, model: str, max_tokens: int = 4, **kw: Any) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=20,
                      json={"model": model, "prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True, **kw})


def test_each_model_goes_to_its_pool_and_models_lists_both(engines):
    engine = engines(model="ext-model")
    backend, internal = _mixed(engine)
    with gateway(backend) as url:
        for model in ("fake", "ext-model", "fake"):
            r = _complete(url, model)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        listing = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        info = httpx.get(url + "/admin/cluster").json()
        assert _complete(url, "other").status_code == 404
    assert listing == ["fake", "ext-model"]
    assert [b["model"] for b in engine.bodies] == ["ext-model"]
    assert len(internal.served) == 2
    assert [p["name"] for p in info["pools"]] == ["ours", "ext"]
    assert {i["pool"] for i in info["instances"]} == {"ext"}  # the engine core lists no instance summaries


def test_the_external_pool_falls_back_to_the_internal_one_when_its_engine_dies(engines):
    engine = engines(model="ext-model")
    backend, _ = _mixed(engine)
    with gateway(backend) as url:
        assert _complete(url, "ext-model").status_code == 200
        engine.stop()
        for _ in range(3):
            r = _complete(url, "ext-model")
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
        metrics = httpx.get(url + "/metrics").text
    assert len(engine.bodies) == 1 and backend.num_fallbacks == 3
    assert 'llumnix:lite_fallbacks_total{model_name="fake"} 3.0' in metrics


def test_the_internal_pool_falls_back_to_the_external_one_with_no_instance_serving(engines):
    engine = engines(model="ext-model")
    backend, _ = _mixed(engine, internal=DownBackend())
    with gateway(backend) as url:
        for _ in range(2):
            r = _complete(url, "fake")
            assert r.status_code == 200, r.text
        health = httpx.get(url + "/health")
    assert [b["model"] for b in engine.bodies] == ["ext-model", "ext-model"]  # the engine's own name
    assert health.status_code == 503 and health.json()["status"] == "degraded"


def test_a_stream_that_breaks_in_the_external_pool_is_resumed_in_the_internal_one(engines):
    engine = engines("break_after:3", model="ext-model")
    backend, _ = _mixed(engine)
    with gateway(backend) as url, httpx.stream("POST", url + "/v1/completions", timeout=20, json={
            "model": "ext-model", "prompt": "Hi", "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and not any("error" in c for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    assert backend.num_resumed == 1


def test_without_a_fallback_a_dead_pool_is_one_clear_error(engines):
    engine = engines(model="ext-model")
    backend, _ = _mixed(engine, ext_fallback=None)
    with gateway(backend) as url:
        engine.stop()
        r = _complete(url, "ext-model")
    assert r.status_code >= 500 and "no pool could serve" in r.json()["error"]["message"]


def test_logprobs_skip_the_external_pool_for_the_internal_one_on_the_route(engines):
    engine = engines(model="ext-model")
    backend, internal = _mixed(engine)
    with gateway(backend) as url:
        r = _complete(url, "ext-model", logprobs=1)
        refused = _mixed(engine, ext_fallback=None)[0]
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is not None, r.text
    assert engine.bodies == [] and len(internal.served) == 1
    with gateway(refused) as url:
        r = _complete(url, "ext-model", logprobs=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
