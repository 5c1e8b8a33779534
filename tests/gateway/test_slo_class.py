"""SLO classes at the gateway: the ``slo_class`` body field and ``X-SLO-Class`` header, the
400 for an unknown class, the class's priority, and ``llumnix:slo_*`` in /metrics."""
from __future__ import annotations

from fastapi.testclient import TestClient

from llumnix.gateway.app import build_app
from llumnix.policy.slo import SLOConfig

BODY = {"model": "fake", "prompt": "x", "max_tokens": 2}


def _spy(backend) -> list:
    seen: list = []
    orig = backend.generate

    def generate(request):
        seen.append((request.slo_class, request.priority))
        return orig(request)

    backend.generate = generate
    return seen


def test_body_field_and_header_name_the_class_and_its_priority(client, backend) -> None:
    seen = _spy(backend)
    assert client.post("/v1/completions", json={**BODY, "slo_class": "interactive"}).status_code == 200
    assert client.post("/v1/completions", json=BODY, headers={"X-SLO-Class": "batch"}).status_code == 200
    # the header wins over the body; an explicit priority wins over the class's
    assert client.post("/v1/completions", json={**BODY, "slo_class": "batch"},
                       headers={"X-SLO-Class": "interactive"}).status_code == 200
    assert client.post("/v1/completions", json={**BODY, "slo_class": "interactive", "priority": 0}).status_code == 200
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "slo_class": "interactive"}
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    assert seen == [("interactive", 1), ("batch", 0), ("interactive", 1), ("interactive", 0), ("interactive", 1)]


def test_unknown_class_is_a_400_naming_slo_class(client) -> None:
    for kw in ({"json": {**BODY, "slo_class": "gold"}}, {"json": BODY, "headers": {"X-SLO-Class": "gold"}}):
        r = client.post("/v1/completions", **kw)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "slo_class" and "gold" in err["message"] and "interactive" in err["message"]


def test_metrics_count_requests_and_attainment_per_class(backend) -> None:
    slo = SLOConfig(classes={"chat": {"ttft_s": 600, "tpot_s": 600, "priority": "high"},
                             "never": {"ttft_s": 1e-9, "tpot_s": 1e-9}}, default_class="never")
    client = TestClient(build_app(backend, slo=slo))
    for cls in ("chat", "chat", "never"):
        assert client.post("/v1/completions", json={**BODY, "slo_class": cls}).status_code == 200
    client.post("/v1/completions", json=BODY)  # no class, normal priority: the default class
    text = client.get("/metrics").text
    assert 'llumnix:slo_requests_total{model_name="fake",slo_class="chat"} 2.0' in text
    assert 'llumnix:slo_met_total{model_name="fake",slo_class="chat"} 2.0' in text
    assert 'llumnix:slo_requests_total{model_name="fake",slo_class="never"} 2.0' in text
    assert 'llumnix:slo_met_total{model_name="fake",slo_class="never"}' not in text


def test_a_shed_request_is_a_429_with_retry_after(client, backend) -> None:
    from llumnix.policy.slo_dispatch import RequestShedError

    def shed(request):
        raise RequestShedError(request.slo_class or "batch", 3)

    backend.generate = shed
    r = client.post("/v1/completions", json={**BODY, "slo_class": "interactive"})
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    err = r.json()["error"]
    assert err["param"] == "slo_class" and "interactive" in err["message"] and "Traceback" not in r.text
