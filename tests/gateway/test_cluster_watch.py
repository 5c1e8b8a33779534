"""``/admin/cluster?after=VERSION``, the long poll behind the page and ``llumnix top``
(``gateway/cluster_watch.py`` over ``cluster/cluster_pulse.py``, LlumSched's side): over a
real socket, a watch answers as the view changes, not at a poll period; an idle view
wakes nobody; waiters are bounded (429) while plain reads and requests go on; the
server's shutdown answers them at once. ``llumnix top`` (a real process) draws a change
as it happens; the page in a browser: tests/gateway/test_dashboard_watch.py."""
from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from llumnix.cluster.cluster_pulse import ClusterPulse
from llumnix.gateway.cluster_watch import ClusterWatch, view_key
from llumnix.gateway.inprocess import InProcessGateway
from tests.gateway.fake_backend import EngineBackend


def instance(iid: str, running: int = 0, age_s: float = 0.2) -> dict[str, Any]:
    return {"instance_id": iid, "freeness": 10.0, "num_running": running, "num_waiting": 0, "num_used_blocks": 0,
            "num_total_blocks": 50, "is_terminating": False, "is_schedulable": True, "num_preemptions": 0,
            "role": None, "age_s": age_s}


class PulseBackend(EngineBackend):
    """The test engine behind the gateway, its cluster view a literal that the test changes,
    watched as LlumSched's is: ``watch_cluster`` over a real ``ClusterPulse`` in a thread
    (as Ray runs LlumSched's watch in its thread pool); ``builds`` counts the views built."""

    def __init__(self) -> None:
        super().__init__()
        self.view: dict[str, Any] = {"dispatch_policy": "llumnix", "num_dispatched": 0, "instances": [instance("i0")],
                                     "migrations": {"committed": 0, "aborted": 0, "in_flight": [], "recent": []}}
        self.pulse = ClusterPulse()
        self.builds = 0
        self._lock = threading.Lock()

    def build(self) -> dict[str, Any]:
        with self._lock:
            self.builds += 1
            return copy.deepcopy(self.view)

    def change(self, **fields: Any) -> None:
        with self._lock:
            self.view.update(fields)
        self.pulse.note()

    async def cluster_info(self) -> dict[str, Any]:
        return self.build()

    async def watch_cluster(self, seen: Any, timeout_s: float) -> tuple[Any, dict[str, Any]]:
        return await asyncio.to_thread(self.pulse.watch, seen, timeout_s, self.build)

    def stop(self) -> None:  # the server's shutdown (InProcessGateway): the thread's watch ends
        self.pulse.close()


def get(url: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}/admin/cluster", params=params, timeout=60)


def test_the_view_key_leaves_out_clocks_but_not_a_silent_instance():
    a = {"instances": [instance("i0", age_s=0.1)], "rescheduling": {"num_passes": 3}}
    b = {"instances": [instance("i0", age_s=2.9)], "rescheduling": {"num_passes": 9}}
    assert view_key(a) == view_key(b)
    assert view_key(a) != view_key({**b, "instances": [instance("i0", age_s=6.0)]})  # "no report for 6 s"
    assert view_key(a) != view_key({**a, "instances": [instance("i0", running=1)]})


def test_a_watch_answers_when_the_view_changes_not_at_a_poll_period():
    backend = PulseBackend()
    with InProcessGateway(backend) as url:
        first = get(url, after="")
        assert first.status_code == 200, first.text
        v1 = first.json()["version"]
        assert first.json()["instances"][0]["num_running"] == 0 and "requests" in first.json()
        answers: list[tuple[float, dict[str, Any]]] = []

        def watch() -> None:
            doc = get(url, after=v1, wait=20).json()
            answers.append((time.monotonic(), doc))
        waiter = threading.Thread(target=watch)
        waiter.start()
        time.sleep(1.0)
        assert not answers  # nothing changed: it waits
        builds_idle = backend.builds
        for _ in range(5):  # an idle instance's status each second: the same view, nobody woken
            backend.change(instances=[instance("i0", age_s=0.5)])
            time.sleep(0.2)
        assert not answers
        changed_at = time.monotonic()
        backend.change(instances=[instance("i0", running=3)])
        waiter.join(10)
        at, doc = answers[0]
        lag = at - changed_at
        print(f"a change reached the watch {1000 * lag:.0f} ms after it was made")
        assert doc["instances"][0]["num_running"] == 3 and doc["version"] != v1
        assert lag < 0.45, lag  # a 0.5 s poll would wait 0.25 s on average, 0.5 s at worst: here one hop
        assert backend.builds - builds_idle <= 8, backend.builds  # one per note (and the next watch's first): no spin
        # at once when the version asked about is not the latest
        t0 = time.monotonic()
        assert get(url, after=v1, wait=20).json()["version"] == doc["version"]
        assert time.monotonic() - t0 < 1.0
        # nothing changes: the answer comes after `wait`, the same version
        t0 = time.monotonic()
        same = get(url, after=doc["version"], wait=0.5).json()
        assert same["version"] == doc["version"] and 0.4 < time.monotonic() - t0 < 5.0


def test_a_backend_without_notice_is_read_on_a_period():
    from tests.gateway.test_metrics import StatusBackend

    with InProcessGateway(StatusBackend()) as url:
        doc = get(url, after="").json()
        assert isinstance(doc["version"], str) and doc["instances"][0]["instance_id"] == "i0"
        assert get(url, after=doc["version"], wait=0.3).json()["version"] == doc["version"]
        assert "version" not in get(url).json()  # a plain read is as before


def test_bad_watch_parameters_are_one_line_400s():
    with InProcessGateway(PulseBackend()) as url:
        for params in ({"after": "", "wait": "-1"}, {"after": "", "wait": "soon"}, {"after": "x" * 65}):
            r = get(url, **params)
            assert r.status_code == 400, (params, r.text)
            assert "\n" not in r.json()["error"]["message"]


def test_a_thousand_watches_are_bounded_and_the_gateway_keeps_serving(monkeypatch):
    monkeypatch.setattr(ClusterWatch, "MAX_WAITERS", 16)
    backend = PulseBackend()

    async def storm(url: str, version: str) -> tuple[list[httpx.Response], float, float]:
        limits = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
            watches = [asyncio.create_task(c.get("/admin/cluster", params={"after": version, "wait": 25}))
                       for _ in range(1000)]
            deadline = time.monotonic() + 60
            while sum(t.done() for t in watches) < 1000 - 16 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # every one answered but the 16 held
            t0 = time.monotonic()
            plain = await c.get("/admin/cluster")
            served = await c.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 4})
            took = time.monotonic() - t0
            assert plain.status_code == 200 and served.status_code == 200, (plain.text, served.text)
            changed_at = time.monotonic()
            backend.change(num_dispatched=1)
            answers = await asyncio.gather(*watches)
            return answers, took, time.monotonic() - changed_at

    with InProcessGateway(backend) as url:
        version = get(url, after="").json()["version"]
        answers, took, woke_s = asyncio.run(storm(url, version))
        again = get(url, after=version, wait=0)
    codes = [r.status_code for r in answers]
    assert codes.count(200) == 16 and codes.count(429) == 1000 - 16, sorted(set(codes))
    assert {r.json()["version"] for r in answers if r.status_code == 200} == {again.json()["version"]} != {version}
    print(f"1000 watches: 16 held, 984 refused; a plain read and a completion meanwhile {1000 * took:.0f} ms; "
          f"the 16 answered {1000 * woke_s:.0f} ms after the change")
    assert took < 5.0 and woke_s < 10.0  # woken by the change, not by their 25 s


def test_a_429_says_what_to_do(monkeypatch):
    monkeypatch.setattr(ClusterWatch, "MAX_WAITERS", 1)
    backend = PulseBackend()
    with InProcessGateway(backend) as url:
        version = get(url, after="").json()["version"]
        held = threading.Thread(target=get, args=(url,), kwargs={"after": version, "wait": 3})
        held.start()
        time.sleep(0.5)
        r = get(url, after=version, wait=3)
        held.join(10)
    assert r.status_code == 429
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and err["param"] == "after"
    assert "poll /admin/cluster without after=" in err["message"]


def test_the_servers_shutdown_answers_the_watches_at_once():
    backend = PulseBackend()
    gateway = InProcessGateway(backend)
    url = gateway.__enter__()
    version = get(url, after="").json()["version"]
    answers: list[int] = []
    waiters = [threading.Thread(target=lambda: answers.append(get(url, after=version, wait=25).status_code))
               for _ in range(5)]
    for w in waiters:
        w.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    gateway.__exit__()
    stopped = time.monotonic() - t0
    for w in waiters:
        w.join(10)
    assert gateway.thread is not None and not gateway.thread.is_alive()
    print(f"shutdown with 5 watches open: {1000 * stopped:.0f} ms")
    assert stopped < 5.0 and answers == [200] * 5, (stopped, answers)


def test_top_draws_a_change_as_it_happens_not_at_its_interval():
    """``--interval 30``: a change drawn within a second is no redraw on a period."""
    backend = PulseBackend()
    changed = re.compile(r"^i0 .* 7 +0 +0$", re.M)
    seen: dict[str, float] = {}
    with InProcessGateway(backend) as url:
        proc = subprocess.Popen([sys.executable, "-m", "llumnix.cli", "top", "--url", url, "--interval", "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

        def read() -> None:  # the time each thing first shows on the terminal
            assert proc.stdout is not None
            out = ""
            while chunk := os.read(proc.stdout.fileno(), 65536):
                out += chunk.decode()
                screen = out.rsplit("\x1b[H\x1b[2J", 1)[-1]
                if "\ni0 " in screen:
                    seen.setdefault("first", time.monotonic())
                if changed.search(screen):
                    seen.setdefault("change", time.monotonic())
        threading.Thread(target=read, daemon=True).start()
        try:
            deadline = time.monotonic() + 30
            while "first" not in seen and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "first" in seen, "no first screen"
            time.sleep(1.0)
            changed_at = time.monotonic()
            backend.change(instances=[instance("i0", running=7)])
            deadline = changed_at + 10
            while "change" not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
    assert "change" in seen, err
    print(f"top drew the change {1000 * (seen['change'] - changed_at):.0f} ms after it (interval 30 s)")
    assert seen["change"] - changed_at < 1.0
    assert proc.returncode == 0, err
