"""vLLM's /version, /ping and /v1/models shapes, and a taken port failing at once."""
from __future__ import annotations

import socket
import time

import pytest
from fastapi.testclient import TestClient

import llumnix
from llumnix.cli import main
from llumnix.cluster.startup import bind_port
from llumnix.core.errors import LlumnixError
from llumnix.gateway.app import build_app
from tests.gateway.fake_backend import EngineBackend


class HealthBackend(EngineBackend):
    status = "ok"

    async def health(self):
        return {"status": self.status}


def test_models_version_and_ping_as_vllm_writes_them():
    backend = HealthBackend()
    client = TestClient(build_app(backend, api_key="k", model_root="/models/smollm2.gguf"))
    assert client.get("/v1/models").status_code == 401  # under the API key, as every /v1 route
    (entry,) = client.get("/v1/models", headers={"Authorization": "Bearer k"}).json()["data"]
    (perm,) = entry.pop("permission")
    assert isinstance(entry.pop("created"), int)
    assert entry == {"id": "fake", "object": "model", "owned_by": "llumnix", "root": "/models/smollm2.gguf",
                     "parent": None, "max_model_len": backend.max_model_len}
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
    assert {k: perm[k] for k in ("allow_sampling", "allow_logprobs", "allow_view", "organization", "group",
                                 "is_blocking")} == {"allow_sampling": True, "allow_logprobs": True,
                                                     "allow_view": True, "organization": "*", "group": None,
                                                     "is_blocking": False}
    # probes: open without the key
    assert client.get("/version").json() == {"version": llumnix.__version__}
    for method in ("GET", "POST"):
        r = client.request(method, "/ping")
        assert (r.status_code, r.content) == (200, b"")
    backend.status = "degraded"  # one instance of two lost: still serving
    assert client.get("/ping").status_code == 200
    backend.status = "unavailable"
    assert client.post("/ping").status_code == 503


def test_without_a_served_name_the_root_is_the_model_name():
    (entry,) = TestClient(build_app(EngineBackend())).get("/v1/models").json()["data"]
    assert entry["root"] == entry["id"] == "fake"


def test_a_taken_port_fails_in_one_line_before_ray_starts(capsys, monkeypatch):
    import llumnix.cluster.launcher as launcher

    monkeypatch.setattr(launcher, "start_cluster", lambda *_a, **_k: pytest.fail("Ray started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        assert main(["serve", "--port", str(port)]) == 2
        assert time.monotonic() - t0 < 1.0
    err = capsys.readouterr()
    assert err.err.strip() == (f"llumnix serve: error: port {port} on 127.0.0.1 is already in use: stop what "
                               "holds it, or pick another with --port")
    assert "ready" not in err.out


def test_the_port_is_ours_from_the_first_second():
    """Bound and listening at once: a second server starting meanwhile fails, even one
    that binds with SO_REUSEADDR as uvicorn does."""
    first = bind_port("127.0.0.1", 0)
    try:
        with pytest.raises(LlumnixError, match="is already in use"):
            bind_port("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
