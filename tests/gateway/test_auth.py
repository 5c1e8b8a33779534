from __future__ import annotations

import pytest

from llumnix.gateway.auth import AuthMiddleware
from llumnix.gateway.context import GatewayConfig


def status(path: str, key: str | None = None, method: str = "GET", **config) -> int:
    auth = AuthMiddleware(None, GatewayConfig(**config))
    headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
    refusal = auth.refusal(path, method, headers)
    return 200 if refusal is None else refusal.status_code


@pytest.mark.parametrize("path,key,method,config,want", [
    ("/health", None, "GET", {"api_key": "k"}, 200),             # probes stay open
    ("/live", None, "GET", {"api_key": "k", "admin_key": "a"}, 200),
    ("/v1/completions", None, "POST", {"api_key": "k"}, 401),
    ("/v1/completions", "k", "POST", {"api_key": "k"}, 200),
    ("/tokenize", "no", "POST", {"api_key": "k"}, 401),
    ("/v1/completions", None, "POST", {}, 200),
    # no admin key: the routes that change the cluster are off, the read-only one as before
    ("/admin/instances/i/drain", None, "POST", {}, 404),
    ("/admin/instances/i/undrain", "k", "POST", {"api_key": "k"}, 404),
    ("/admin/cluster", None, "GET", {}, 200),
    ("/admin/cluster", None, "GET", {"admin_requires_key": True}, 403),
    ("/admin/cluster", None, "GET", {"api_key": "k"}, 401),
    ("/admin/cluster", "k", "GET", {"api_key": "k", "admin_requires_key": True}, 200),
    # an admin key guards every admin route, and the API key does not open them
    ("/admin/instances/i/drain", "a", "POST", {"admin_key": "a"}, 200),
    ("/admin/instances/i/drain", "k", "POST", {"admin_key": "a", "api_key": "k"}, 401),
    ("/admin/cluster", None, "GET", {"admin_key": "a"}, 401),
    ("/admin/cluster", "a", "GET", {"admin_key": "a", "admin_requires_key": True}, 200),
])
def test_who_may_pass(path, key, method, config, want):
    assert status(path, key, method, **config) == want
