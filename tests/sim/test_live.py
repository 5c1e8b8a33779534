"""``llumnix simulate --live``: a paced run decides what a plain run decides, its document
is ``/admin/cluster``'s shape, and a real process serves the dashboard and the document
for each system side by side, shows a migration as it happens (and in ``llumnix top``),
never runs ahead of its pace, and ends on SIGTERM with exit 0. In a browser, with 64
instances: tests/sim/test_live_browser.py."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from llumnix.sim.config import load_config
from llumnix.sim.live import LiveRun
from llumnix.sim.live_server import first_point
from llumnix.sim.runner import make_simulator, run_one

CONFIG = """\
name: live-test
latency_model: a10-llama7b
cluster: {num_instances: 3, num_blocks: 300, max_model_len: 4000}
systems:
  llumnix: {dispatch: llumnix, migration: true, migrate_out_threshold: 3}
  round-robin: {dispatch: round-robin}
traces:
  - {name: L-L, kind: L-L, num_requests: 60, rates: [1.0]}
"""
"""Three small instances: llumnix's first migration at ~58 simulated seconds, the run ~195 s."""
SPEED = 40.0


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "live.yaml"
    path.write_text(CONFIG)
    return path


def test_a_paced_run_decides_as_a_plain_run(config):
    spec = first_point(load_config(str(config), []))[0]
    plain = run_one(spec)
    live = LiveRun("llumnix", make_simulator(spec), speed=1e9)
    live.run()
    assert live.error is None and live.summary is not None
    for key in ("num_finished", "migrations", "prefill", "decode", "num_preemptions"):
        assert live.summary[key] == plain[key], key
    doc = json.loads(live.body)
    n = plain["num_finished"]
    assert doc["sim"]["done"] and doc["sim"]["num_finished"] == n == doc["requests"]["num_finished"] > 50
    assert doc["migrations"]["committed"] == plain["migrations"]["num_committed"] > 0
    assert sum(doc["requests"]["ttft"]["counts"]) == n
    assert len(doc["requests"]["ttft"]["counts"]) == len(doc["requests"]["ttft"]["bounds"]) + 1


def test_the_document_has_the_gateways_shape(config):
    spec = first_point(load_config(str(config), []))[0]
    live = LiveRun("llumnix", make_simulator(spec), speed=1e9)
    live.run()
    doc = live.document(live.sim.clock.now())
    assert doc["dispatch_policy"] == "llumnix" and doc["num_dispatched"] == 60 - live.sim.metrics.num_rejected
    inst = doc["instances"][0]
    assert set(inst) >= {"instance_id", "freeness", "num_running", "num_waiting", "num_used_blocks",
                         "num_total_blocks", "is_terminating", "is_schedulable", "num_preemptions", "role",
                         "lifecycle", "age_s"}
    m = doc["migrations"]["recent"][0]
    assert set(m) >= {"request_id", "src_instance_id", "dst_instance_id", "committed", "downtime", "end_time",
                      "reported_at", "was_queued"}
    assert m["reported_at"] - live.epoch == pytest.approx(live.sim.metrics.migrations[0].end_time)


def test_a_speed_that_is_not_positive_is_one_line(config):
    r = subprocess.run([sys.executable, "-m", "llumnix.cli", "simulate", str(config), "--live", "--speed", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "llumnix simulate: error: --speed must be > 0, got 0"
    r = subprocess.run([sys.executable, "-m", "llumnix.cli", "simulate", str(config), "--live", "--seeds", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--seeds does not apply with --live" in r.stderr and "Traceback" not in r.stderr


def read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return lines
    pytest.fail(f"no line matching {pattern!r} within {timeout_s} s: {lines}")


def wait_for_migration(url: str, timeout_s: float) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """The first committed migration the document lists, and (wall, simulated time) pairs seen."""
    paces: list[tuple[float, float]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = httpx.get(f"{url}/admin/cluster").json()
        paces.append((time.monotonic(), doc["sim"]["time_s"]))
        moved = [m for m in doc["migrations"]["recent"] if m["committed"]]
        if moved:
            return moved[0], paces
        time.sleep(0.05)
    pytest.fail(f"no migration within {timeout_s} s")


def test_a_live_process_serves_both_systems_and_shows_a_migration(config):
    proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "simulate", str(config), "--live", "--port", "0",
                             "--speed", str(SPEED)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        head = read_until(proc, r"round-robin +http", 60)
        started = time.monotonic()
        urls = dict(re.findall(r"^  (\S+) +(http://\S+)/dashboard", "\n".join(head), re.M))
        assert set(urls) == {"llumnix", "round-robin"}, head
        assert "live: live-test, L-L at 1 req/s, 60 requests, 3 instances, 40x wall-clock speed" in head[0]
        url = urls["llumnix"]
        base = url.rsplit("/", 1)[0]
        page = httpx.get(f"{url}/dashboard")
        assert page.status_code == 200 and "<title>Llumnix cluster</title>" in page.text
        index = httpx.get(f"{base}/").text
        assert 'href="llumnix/dashboard"' in index and 'href="round-robin/dashboard"' in index
        assert httpx.get(f"{base}/nowhere").status_code == 404
        m, paces = wait_for_migration(url, 30)
        assert m["src_instance_id"] != m["dst_instance_id"] and m["downtime"] > 0
        # never ahead of its pace (one tick of slack: the document is built every 0.2 s)
        assert all(sim_t <= SPEED * (wall - started + 0.5) for wall, sim_t in paces), paces
        top = subprocess.run([sys.executable, "-m", "llumnix.cli", "top", "--once", "--url", url],
                             capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        assert re.search(r"^simulated: llumnix, L-L at 1 req/s, 60 requests, 3 instances; t = [\d.]+ s at 40x",
                         top.stdout, re.M), top.stdout
        assert re.search(r"instance-\d -> instance-\d  committed, stall [\d.]+ ms$", top.stdout, re.M), top.stdout
        rr = httpx.get(f"{urls['round-robin']}/admin/cluster").json()
        assert rr["dispatch_policy"] == "round-robin" and rr["migrations"]["committed"] == 0
        tail = read_until(proc, r"^the runs ended", 60)
        assert any(re.match(r"L-L +1 llumnix ", line) for line in tail), tail
        assert any(re.match(r"L-L +1 round-robin ", line) for line in tail), tail
        assert httpx.get(f"{url}/admin/cluster").json()["sim"]["done"] is True  # the last state stays
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_pd_hand_offs_are_listed_as_llumsched_lists_them(tmp_path):
    path = tmp_path / "pd.yaml"
    path.write_text(CONFIG.replace("systems:\n", "systems:\n  pd: {dispatch: llumnix, migration: true, "
                                                 "pd: {mode: static, prefill_instances: 1}}\n"))
    spec = first_point(load_config(str(path), []))[0]
    assert spec.system.name == "pd"
    live = LiveRun("pd", make_simulator(spec), speed=1e9)
    live.run()
    doc = json.loads(live.body)
    handoffs = doc["pd"]["handoffs_recent"]
    assert len(handoffs) == 50 and all(h["committed"] for h in handoffs)
    roles = {i["instance_id"]: i["role"] for i in doc["instances"]}
    assert sorted(roles.values()) == ["decode", "decode", "prefill"]
    assert all(roles[h["src_instance_id"]] == "prefill" and roles[h["dst_instance_id"]] == "decode" for h in handoffs)
