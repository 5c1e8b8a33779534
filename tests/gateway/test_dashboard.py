"""``/dashboard``: one self-contained page from the package, keyed as ``/admin/cluster``
(the key also taken from ``?key=``, which a browser's address bar can carry), and the
request counters ``/admin/cluster`` gives it for its rates and percentiles. The page in a
real browser over a real cluster: tests/cluster/test_dashboard_browser.py."""
from __future__ import annotations

import re
from importlib.resources import files

from fastapi.testclient import TestClient

from llumnix.gateway.app import build_app
from llumnix.gateway.metrics import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS


def test_the_page_is_in_the_package_and_fetches_nothing_from_elsewhere(client):
    r = client.get("/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-store"
    assert r.text == (files("llumnix.gateway") / "static" / "dashboard.html").read_text()
    # no external script, style, image or font: every src/href is absent or local
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", r.text)
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", r.text)
    assert "<script>" in r.text and "<style>" in r.text  # inline, no build step


def test_the_page_is_keyed_as_the_cluster_view(backend):
    c = TestClient(build_app(backend, admin_key="adm", api_key="api"))
    refused = c.get("/dashboard")
    assert refused.status_code == 401
    assert "/dashboard?key=KEY" in refused.json()["error"]["message"]
    assert c.get("/dashboard?key=api").status_code == 401  # the API key does not open admin views
    assert c.get("/dashboard?key=adm").status_code == 200
    assert c.get("/dashboard", headers={"Authorization": "Bearer adm"}).status_code == 200
    assert c.get("/admin/cluster?key=adm").status_code == 401  # the query key is the page's only

    api_only = TestClient(build_app(backend, api_key="s%cret"))
    assert api_only.get("/dashboard?key=nope").status_code == 401
    assert api_only.get("/dashboard?key=s%25cret").status_code == 200  # percent-decoded
    assert TestClient(build_app(backend, admin_requires_key=True)).get("/dashboard").status_code == 403
    assert TestClient(build_app(backend)).get("/dashboard").status_code == 200  # loopback, no key


def test_cluster_view_carries_the_gateways_request_counters(client):
    before = client.get("/admin/cluster").json()["requests"]
    assert before["num_finished"] == 0
    assert before["ttft"]["bounds"] == list(TTFT_BUCKETS)
    assert before["itl"]["bounds"] == list(TOKEN_LATENCY_BUCKETS)
    assert len(before["ttft"]["counts"]) == len(TTFT_BUCKETS) + 1  # and one above every bound
    for _ in range(2):
        r = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 5})
        assert r.status_code == 200
    after = client.get("/admin/cluster").json()["requests"]
    assert after["num_finished"] == 2 and after["num_output_tokens"] == 10
    assert sum(after["ttft"]["counts"]) == 2
    assert sum(after["itl"]["counts"]) == 2 * 4  # four gaps between five tokens, each request
    assert after["time"] >= before["time"]
