"""``/dashboard`` in headless Chromium over a real 2-instance cluster: the page shows both
instances, a drain's migration appears on it within 2 s of reaching ``/admin/cluster``
(source, destination, outcome), the drained instance shows as terminating; a screenshot
is saved and the page logs no error (no uncaught exception, no console error, no failed
load, nothing in its error box)."""
from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.cluster.helpers import ADMIN, ADMIN_KEY, running_cluster, serve_cluster
from tests.devtools import DevTools, chromium, headless_page, wait_for

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROWS = "[...document.querySelectorAll('#migrations tbody tr')].map(r => ({...r.dataset}))"
STATES = "[...document.querySelectorAll('#instances tbody tr')].map(r => [r.dataset.instanceId, r.cells[1].textContent])"


def complete(url: str, model: str) -> None:
    httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "tell me a story", "max_tokens": 400,
                                              "ignore_eos": True, "temperature": 0}, timeout=120)


def busy_instance(url: str) -> str | None:
    instances = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["instances"]
    return next((x["instance_id"] for x in instances if x["num_running"]), None)


def migrate_by_drain(url: str) -> tuple[dict[str, Any], float, str, list[threading.Thread]]:
    """Long requests on both instances, and a drain of a busy one: the first migration
    out of it committed, when the test saw it in ``/admin/cluster``, the drained instance
    and the request threads. A request can end before its migration starts (the tiny
    model is fast): then the instance is undrained and the drain tried again."""
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    threads: list[threading.Thread] = []
    for _ in range(5):
        batch = [threading.Thread(target=complete, args=(url, model)) for _ in range(6)]
        for t in batch:
            t.start()
        threads += batch
        busy = wait_for(lambda: busy_instance(url), 30, "a request running")
        assert httpx.post(f"{url}/admin/instances/{busy}/drain", headers=ADMIN).status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            recent = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["migrations"]["recent"]
            moved = [m for m in recent if m["committed"] and m["src_instance_id"] == busy]
            if moved:
                return moved[0], time.monotonic(), busy, threads
            time.sleep(0.02)
        assert httpx.post(f"{url}/admin/instances/{busy}/undrain", headers=ADMIN).status_code == 200
    pytest.fail("no drain's migration committed in 5 tries")


def open_dashboard(page: DevTools, url: str) -> None:
    page.call("Page.navigate", url=f"{url}/dashboard?key={ADMIN_KEY}")
    wait_for(lambda: page.evaluate("Number(document.body?.dataset.polls || 0)") >= 2, 30, "the page polling")
    ids = wait_for(lambda: [s[0] for s in page.evaluate(STATES)] or None, 10, "instance rows")
    assert ids == ["instance-0", "instance-1"]
    assert page.evaluate("document.body.dataset.watching") == "yes"  # LlumSched's watch_cluster, through the gateway


def test_a_drains_migration_shows_on_the_dashboard_within_2_s(tiny_model_dir, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("no headless browser: Debian's chromium package is not installed "
                    "(apt-get install -y chromium; .ci/run installs it)")
    with running_cluster(tiny_model_dir, "dash", instances=2, engine={"num_blocks": 400}) as c, \
            serve_cluster(c, tiny_model_dir) as (url, _), headless_page(exe, tmp_path / "profile") as page:
        open_dashboard(page, url)
        report, seen_at, drained, threads = migrate_by_drain(url)
        rid = report["request_id"]
        row = wait_for(lambda: next((r for r in page.evaluate(ROWS) if r["requestId"] == rid), None),
                       2.0, f"migration of {rid} on the page")
        lag = time.monotonic() - seen_at
        print(f"migration of {rid} on the page {lag * 1000:.0f} ms after /admin/cluster had it")
        assert (row["src"], row["dst"], row["outcome"]) == (drained, report["dst_instance_id"], "committed")
        assert row["kind"] == "migration"
        # and by the page's own clock: shown within 2 s of LlumSched learning of it
        assert float(row["shownAt"]) - float(row["reportedAt"]) < 2.0, row
        states = dict(page.evaluate(STATES))
        assert states[drained] == "terminating (drain)", states  # LlumSched's lifecycle, and why
        for t in threads:
            t.join(120)
        time.sleep(1.0)  # a second of polls after the requests' end: the chart and the rates move
        page.screenshot(tmp_path / "dashboard.png")
        assert page.evaluate("document.getElementById('errors').textContent") == ""
        assert page.console_errors() == []
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        print(f"screenshot: {tmp_path / 'dashboard.png'}")
