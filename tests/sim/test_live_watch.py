"""``llumnix simulate --live``'s ``/admin/cluster?after=VERSION``: the long poll the page
uses there as on a gateway. Over a real socket: the next document as soon as it is
published, a wait while none comes (a run that ended), bounded waiters (429), bad input
as one line, and the server's close answering every waiter at once."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from llumnix.sim import live_server
from llumnix.sim.config import load_config
from llumnix.sim.live_server import LiveSession, first_point
from tests.sim.test_live import CONFIG


@pytest.fixture
def session(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "live.yaml"
    path.write_text(CONFIG)
    s = LiveSession(first_point(load_config(str(path), [])), 1e9, "127.0.0.1", 0)  # done at once
    s.start()
    s.wait()
    yield s
    s.server.close()


def test_a_watch_waits_for_the_next_document(session):
    url = f"{session.server.url}/llumnix/admin/cluster"
    run = session.runs["llumnix"]
    doc = httpx.get(url, params={"after": ""}).json()
    assert doc["version"] == f"sim-{run.num_versions}" and doc["sim"]["done"] is True
    t0 = time.monotonic()
    same = httpx.get(url, params={"after": doc["version"], "wait": 0.5}).json()
    assert same["version"] == doc["version"] and time.monotonic() - t0 >= 0.45  # the run ended: nothing new
    answers: list[tuple[float, dict]] = []

    def watch() -> None:
        got = httpx.get(url, params={"after": doc["version"], "wait": 20}, timeout=30).json()
        answers.append((time.monotonic(), got))
    waiter = threading.Thread(target=watch)
    waiter.start()
    time.sleep(0.5)
    assert not answers
    published = time.monotonic()
    run._publish(run.sim.clock.now())  # as the run's thread publishes each tick
    waiter.join(10)
    assert answers and answers[0][1]["version"] == f"sim-{run.num_versions}" != doc["version"]
    assert answers[0][0] - published < 0.45, answers[0][0] - published


def test_bad_input_and_too_many_waiters(session, monkeypatch):
    url = f"{session.server.url}/llumnix/admin/cluster"
    r = httpx.get(url, params={"after": "", "wait": "later"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "wait"
    monkeypatch.setattr(live_server, "MAX_WAITERS", 3)
    version = httpx.get(url).json()["version"]
    codes: list[int] = []
    held = [threading.Thread(target=lambda: codes.append(
        httpx.get(url, params={"after": version, "wait": 20}, timeout=30).status_code)) for _ in range(3)]
    for t in held:
        t.start()
    time.sleep(0.5)
    refused = httpx.get(url, params={"after": version, "wait": 20})
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(url).status_code == 200  # a plain read still answers
    t0 = time.monotonic()
    session.server.close()  # the server's end answers the three at once
    for t in held:
        t.join(10)
    assert codes == [200] * 3 and time.monotonic() - t0 < 5.0, codes
