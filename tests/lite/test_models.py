"""Routing by the request's ``model``: pools by name or ``prefix*``, /v1/models listing
every name the pools serve, and vLLM's 404 for any other, over real HTTP fake engines."""
from __future__ import annotations

from typing import Any

import httpx

from tests.lite.conftest import gateway, lite_backend


def _complete(url: str, model: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 3}, timeout=20)


def _two_models(engines: Any) -> tuple[Any, Any, Any]:
    """Pool 'a' serves model-a by name; pool 'b' every name starting 'model-b' (its engine
    lists model-b and model-b-large)."""
    a = engines(model="model-a")
    b = engines(model="model-b", models=("model-b-large",))
    backend = lite_backend([("a", [a], {"models": ("model-a",)}), ("b", [b], {"models": ("model-b*",)})],
                           model_name="model-a")
    return a, b, backend


def test_a_request_goes_to_the_pool_that_serves_its_model(engines):
    a, b, backend = _two_models(engines)
    with gateway(backend) as url:
        for model in ("model-a", "model-b", "model-b-large", "model-a"):
            r = _complete(url, model)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model  # the answer names the model asked for, as vLLM's
        with httpx.stream("POST", url + "/v1/completions", timeout=20,
                          json={"model": "model-b-large", "prompt": "Hi", "max_tokens": 2, "stream": True}) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert chunks and all('"model":"model-b-large"' in c.replace(" ", "") for c in chunks)
    assert [body["model"] for body in a.bodies] == ["model-a", "model-a"]
    assert [body["model"] for body in b.bodies] == ["model-b", "model-b-large", "model-b-large"]


def test_a_prefix_match_the_engine_does_not_list_is_sent_as_the_engines_model(engines):
    _, b, backend = _two_models(engines)
    with gateway(backend) as url:
        assert _complete(url, "model-b-chat").status_code == 200
    assert [body["model"] for body in b.bodies] == ["model-b"]


def test_models_lists_every_model_the_pools_serve(engines):
    _, _, backend = _two_models(engines)
    with gateway(backend) as url:
        listing = httpx.get(url + "/v1/models").json()
    assert [m["id"] for m in listing["data"]] == ["model-a", "model-b", "model-b-large"]
    assert all(m["object"] == "model" and m["max_model_len"] == 4096 for m in listing["data"])


def test_an_unknown_model_is_vllms_404_and_reaches_no_engine(engines):
    a, b, backend = _two_models(engines)
    with gateway(backend) as url:
        r = _complete(url, "gpt-4")
        chat = httpx.post(url + "/v1/chat/completions", timeout=20, json={
            "model": "model-c", "messages": [{"role": "user", "content": "hi"}]})
    for resp in (r, chat):
        assert resp.status_code == 404
        err = resp.json()["error"]
        assert err["code"] == "model_not_found" and err["type"] == "NotFoundError" and err["param"] == "model"
    assert "'model-a', 'model-b', 'model-b-large'" in r.json()["error"]["message"]
    assert a.bodies == [] and b.bodies == []


def test_a_fallback_only_pool_does_not_make_its_models_servable(engines):
    """A pool of weight 0 takes only its primaries' overflow: its own names are unknown."""
    main, spare = engines(model="model-a"), engines(model="model-z")
    backend = lite_backend([("a", [main], {"models": ("model-a",), "fallback": "z"}),
                            ("z", [spare], {"models": ("model-a", "model-z"), "weight": 0.0})],
                           model_name="model-a")
    with gateway(backend) as url:
        assert _complete(url, "model-z").status_code == 404
        main.stop()
        assert _complete(url, "model-a").status_code == 200
    assert [body["model"] for body in spare.bodies] == ["model-z"]  # the spare's own name for it
