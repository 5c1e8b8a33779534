"""A request its dispatch refuses (a shed request, issue 47) is answered 429 with
``Retry-After`` before any header of a stream goes out, completions and chat alike, and
is not aborted on any instance (none has it); a refusal after a stream's headers stays
an event in the stream."""
from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fastapi.testclient import TestClient

from llumnix.core.wire import GenerateRequest
from llumnix.gateway.app import build_app
from llumnix.policy.slo_dispatch import RequestShedError
from tests.gateway.fake_backend import EngineBackend


class ShedBackend(EngineBackend):
    """Refuses every request of the ``interactive`` class at dispatch."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator:
        if request.slo_class == "interactive":
            raise RequestShedError("interactive", 3)
        async for out in super().generate(request):
            yield out


@pytest.fixture()
def shed():
    backend = ShedBackend()
    with TestClient(build_app(backend)) as client:
        yield client, backend


@pytest.mark.parametrize("path,extra", [("/v1/completions", {"prompt": "abc"}),
                                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_request_is_a_429_with_retry_after(shed, path: str, extra: dict, stream: bool) -> None:
    client, backend = shed
    r = client.post(path, json={"model": "fake", "max_tokens": 3, "slo_class": "interactive", "stream": stream,
                                **extra})
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "3"
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["param"] == "slo_class" and "retry after 3 s" in err["message"]
    assert backend.aborted == []  # refused at dispatch: nothing to abort anywhere


def test_a_served_stream_is_unchanged(shed) -> None:
    client, _ = shed
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "fake", "max_tokens": 3, "slo_class": "batch", "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"role":"assistant"' in lines[0]
