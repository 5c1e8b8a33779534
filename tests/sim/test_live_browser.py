"""``/dashboard`` in headless Chromium over ``llumnix simulate --live`` with 64 instances
(the issue's goal: the page stays responsive with 64 instances, simulator-driven): all 64
rows, a migration on the page within 2 s of the document listing it, updates on the page
within 1 s of the server publishing them (median under 0.75 s, at most 2 of 10 over 1 s:
a loaded 2-core machine stalls the browser now and then), a poll drawn in under 50 ms and
the main thread free within 0.1 s (medians), and no error; a screenshot is saved."""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.devtools import chromium, headless_page, wait_for
from tests.sim.test_live import read_until

pytestmark = pytest.mark.slow

CONFIG = """\
name: live-64
latency_model: a10-llama7b
cluster: {num_instances: 64, num_blocks: 300, max_model_len: 4000}
systems:
  llumnix: {dispatch: llumnix, migration: true, migrate_out_threshold: 3}
traces:
  - {name: L-L, kind: L-L, num_requests: 3000, rates: [22]}
"""
"""~260 requests running on 64 instances after a simulated minute; the first migrations at ~20 s."""
SPEED = 4.0
ROWS = "[...document.querySelectorAll('#migrations tbody tr')].map(r => r.dataset.requestId)"


def update_lag(page, url: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds from the server publishing a document to the page showing it (or a later one)."""
    sim = httpx.get(f"{url}/admin/cluster").json()["sim"]
    wait_for(lambda: float(page.evaluate("document.body.dataset.simTime || -1")) >= sim["time_s"], 5.0, "an update", every_s=0.02)
    return time.time() - sim["published_at"]


def test_64_simulated_instances_on_the_dashboard(tmp_path: Path):
    exe = chromium()
    if exe is None:
        pytest.skip("no headless browser: Debian's chromium package is not installed "
                    "(apt-get install -y chromium; .ci/run installs it)")
    config = tmp_path / "live64.yaml"
    config.write_text(CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "simulate", str(config), "--live", "--port", "0",
                             "--speed", str(SPEED)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        head = read_until(proc, r"llumnix +http", 60)
        url = re.search(r"(http://\S+)/dashboard", head[-1])[1]  # type: ignore[index]
        with headless_page(exe, tmp_path / "profile") as page:
            page.call("Page.navigate", url=f"{url}/dashboard")
            wait_for(lambda: page.evaluate("document.querySelectorAll('#instances tbody tr').length") == 64, 30,
                     "64 instance rows")
            moved = wait_for(lambda: [m for m in httpx.get(f"{url}/admin/cluster").json()["migrations"]["recent"]
                                      if m["committed"]], 60, "a committed migration")
            listed = time.monotonic()
            rid = moved[0]["request_id"]
            wait_for(lambda: rid in page.evaluate(ROWS), 2.0, f"migration of {rid} on the page", every_s=0.02)
            shown = time.monotonic() - listed
            lags, renders = [], []
            for _ in range(10):
                lags.append(update_lag(page, url))
                renders.append(float(page.evaluate("document.body.dataset.renderMs")))
                time.sleep(0.37)  # land anywhere in the page's 0.5 s poll
            probes = []  # the page's main thread: how long a script waits for it
            for _ in range(20):
                t0 = time.monotonic()
                page.evaluate("1")
                probes.append(time.monotonic() - t0)
                time.sleep(0.13)
            render_max_ms = float(page.evaluate("document.body.dataset.renderMaxMs"))
            print(f"64 instances: migration on the page {1000 * shown:.0f} ms after the document; update lag "
                  f"median {statistics.median(lags):.2f} s, max {max(lags):.2f} s; a poll's drawing median "
                  f"{statistics.median(renders):.1f} ms (max {render_max_ms:.1f}); main-thread probe median "
                  f"{1000 * statistics.median(probes):.0f} ms, max {1000 * max(probes):.0f} ms")
            # within 1 s; a loaded 2-core machine stalls the browser now and then (benchmarks/dashboard_cpu.py sim64)
            assert statistics.median(lags) < 0.75 and sum(lag > 1.0 for lag in lags) <= 2, lags
            assert statistics.median(renders) < 50 and statistics.median(probes) < 0.1, (renders, probes)
            page.screenshot(tmp_path / "dashboard64.png")
            assert page.evaluate("document.getElementById('errors').textContent") == ""
            assert page.console_errors() == []
            assert "simulated llumnix" in page.evaluate("document.getElementById('meta').textContent")
        assert (tmp_path / "dashboard64.png").stat().st_size > 10_000
        print(f"screenshot: {tmp_path / 'dashboard64.png'}")
    finally:
        proc.kill()
        proc.wait()
