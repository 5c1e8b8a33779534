"""Fault tolerance on a real cluster: instance actors killed mid-stream (their requests
resume elsewhere from prompt + streamed tokens), a migration whose source dies, LlumSched
killed mid-run, and the last instance gone (a clear error, never a hang).

The tests run in file order on one 3-instance cluster; each kills one more actor.
"""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.cluster.helpers import (
    ADMIN,
    StreamResult,
    running_cluster,
    stream_completion,
    wait_idle,
    where_is,
)

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a 3-instance cluster of its own: about 25-60 s on 2 cores

N_TOKENS = 300
PROMPTS = ["The first request", "A second one, longer than the first", "third", "4th request here"]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    # migration timeout 2 s: dead sources' reservations are freed in 4 s. queued_moves: fits
    # makes every migrate_out read its destination's status over Ray (the drains here still
    # move every request: running ones always, queued ones where they start at once).
    # No replacement of lost instances: each test here kills one more, down to none.
    with running_cluster(tiny_model_dir, "ft", instances=4, engine={"num_blocks": 600}, replace_lost_instances=False,
                         migration={"timeout_s": 2.0},
                         scheduling={"rescheduling": {"queued_moves": "fits"}}) as c:
        yield c


def _body(prompt: str, n: int = N_TOKENS) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": n, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def model_name(server):
    return httpx.get(f"{server[0]}/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def reference(server, model_name):
    """Greedy texts with no failure: what every resumed stream must equal."""
    url, _ = server

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*(stream_completion(c, url, {**_body(p), "model": model_name})
                                          for p in PROMPTS))

    refs = asyncio.run(main())
    assert all(r.completion_tokens == N_TOKENS and not r.errors for r in refs)
    return {p: r.text for p, r in zip(PROMPTS, refs, strict=True)}


def _live(cluster, backend) -> dict:
    return {iid: a for iid, a in backend.instances.items()}


async def _run_and_kill(url, model_name, cluster, backend, victim_of: int, after_chunks: int,
                        before_kill=None):
    """Stream every prompt; once request ``victim_of`` has streamed ``after_chunks`` chunks,
    kill the instance that holds it. Returns (results, killed instance id)."""
    progress = [StreamResult() for _ in PROMPTS]
    killed = None
    async with httpx.AsyncClient(timeout=120) as c:
        tasks = [asyncio.create_task(stream_completion(c, url, {**_body(p), "model": model_name}, pr))
                 for p, pr in zip(PROMPTS, progress, strict=True)]
        deadline = time.time() + 60
        target = progress[victim_of]
        while time.time() < deadline and not target.done:
            if target.num_chunks >= after_chunks and target.request_id:
                if before_kill is not None:
                    await before_kill(target.request_id)
                killed = await asyncio.to_thread(where_is, dict(backend.instances), target.request_id)
                if killed is not None:
                    ray.kill(backend.instances[killed])
                    break
            await asyncio.sleep(0.005)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return results, killed


def test_instance_killed_mid_stream_resumes_on_a_survivor_with_the_same_greedy_text(
        server, cluster, reference, model_name):
    url, backend = server
    results, killed = asyncio.run(_run_and_kill(url, model_name, cluster, backend, 0, 10))
    assert killed is not None, "the request finished before it could be killed"
    for p, r in zip(PROMPTS, results, strict=True):
        assert not r.errors, r.errors
        assert r.done and r.finish_reason == "length" and r.completion_tokens == N_TOKENS
        assert r.text == reference[p]  # one continuous stream: no gap, no repeat
    assert backend.failover.num_resumed >= 1 and killed not in backend.instances
    counts = wait_idle(backend.instances)
    assert len(counts) == 3 and all(c["num_used_blocks"] == 0 for c in counts.values()), counts
    deadline = time.time() + 10
    while time.time() < deadline:  # LlumSched forgets it (told by the gateway, or its health check)
        info = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
        if killed not in {i["instance_id"] for i in info["instances"]}:
            break
        time.sleep(0.1)
    assert killed not in {i["instance_id"] for i in info["instances"]}


def test_llumsched_killed_mid_run_streams_survive_fallback_then_recovery(server, cluster, reference,
                                                                          model_name):
    url, backend = server
    fallbacks0 = backend.num_fallback_dispatches

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            streams = [asyncio.create_task(stream_completion(c, url, {**_body(p), "model": model_name}))
                       for p in PROMPTS[:2]]
            await asyncio.sleep(0.2)
            ray.kill(cluster.llumsched, no_restart=False)
            t0 = time.time()
            r = await c.post(f"{url}/v1/completions", json={**_body("during", 4), "model": model_name})
            served_in = time.time() - t0
            return await asyncio.gather(*streams), r, served_in

    streams, during, served_in = asyncio.run(main())
    for p, r in zip(PROMPTS[:2], streams, strict=True):
        assert not r.errors and r.completion_tokens == N_TOKENS and r.text == reference[p]
    assert during.status_code == 200 and served_in < 5
    deadline = time.time() + 30
    info: dict = {}
    while time.time() < deadline:  # restarted by Ray; re-learns the three survivors from their pushes
        with_info = httpx.get(f"{url}/admin/cluster", headers=ADMIN)
        if with_info.status_code == 200:
            info = with_info.json()
            if len(info["instances"]) == 3:
                break
        time.sleep(0.2)
    assert len(info["instances"]) == 3, info
    r = httpx.post(f"{url}/v1/completions", json={**_body("after", 4), "model": model_name}, timeout=30)
    assert r.status_code == 200
    after = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()
    assert after["num_dispatched"] >= info["num_dispatched"] + 1  # LlumSched dispatches again
    assert backend.num_fallback_dispatches >= fallbacks0  # fallback used only while it was down
    counts = wait_idle(backend.instances)
    assert all(c["num_used_blocks"] == 0 for c in counts.values()), counts


def test_llumsched_restarted_mid_scale_in_still_stops_the_victim_once_empty(server, cluster, reference,
                                                                            model_name):
    """Scale-in marked an instance (stop once empty) and LlumSched died: the restarted
    LlumSched learns from the instance that it is being scaled in, lets migration drain
    it and stops it; the stream that was on it completes whole."""
    url, backend = server
    num_before = len(backend.instances)

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            pr = StreamResult()
            task = asyncio.create_task(stream_completion(c, url, {**_body(PROMPTS[1]), "model": model_name}, pr))
            while pr.num_chunks < 5 and not pr.done:
                await asyncio.sleep(0.005)
            victim = await asyncio.to_thread(where_is, dict(backend.instances), pr.request_id)
            ray.kill(cluster.llumsched, no_restart=False)  # what it knew of the scale-in is lost
            await asyncio.to_thread(ray.get, backend.instances[victim].set_terminating.remote(True, True),
                                    timeout=10)
            return await asyncio.wait_for(task, 120), victim

    res, victim = asyncio.run(main())
    assert victim is not None
    assert not res.errors and res.completion_tokens == N_TOKENS and res.text == reference[PROMPTS[1]]
    deadline = time.time() + 40
    info: dict = {}
    while time.time() < deadline:
        r = httpx.get(f"{url}/admin/cluster", headers=ADMIN)
        if r.status_code == 200:
            info = r.json()
            if any(e["kind"] == "stopped" and e["instance_id"] == victim for e in info["scaling"]["events"]):
                break
        time.sleep(0.2)
    assert any(e["kind"] == "stopped" and e["instance_id"] == victim for e in info["scaling"]["events"]), info
    assert victim not in {i["instance_id"] for i in info["instances"]}
    deadline = time.time() + 10
    while victim in backend.instances and time.time() < deadline:  # the gateway sees it gone
        time.sleep(0.1)
    assert victim not in backend.instances
    counts = wait_idle(backend.instances)
    assert len(counts) == num_before - 1 and all(c["num_used_blocks"] == 0 for c in counts.values()), counts


def test_migration_whose_source_dies_aborts_cleanly_and_its_requests_resume(server, cluster, reference,
                                                                            model_name):
    """Drain the instance holding a request (its requests start migrating out) and kill
    it mid-drain: migrations from it abort, the destination frees its reservations (the
    watchdog), and every request still on it resumes on the survivor."""
    url, backend = server
    seen: dict = {}

    async def drain_first(request_id: str) -> None:
        where = await asyncio.to_thread(where_is, dict(backend.instances), request_id)
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{url}/admin/instances/{where}/drain", headers=ADMIN)
            assert r.status_code == 200, r.text
        await asyncio.sleep(0.02)
        seen["in_flight"] = httpx.get(f"{url}/admin/cluster", headers=ADMIN).json()["migrations"]["in_flight"]

    results, killed = asyncio.run(_run_and_kill(url, model_name, cluster, backend, 1, 10, drain_first))
    assert killed is not None
    for p, r in zip(PROMPTS, results, strict=True):
        assert not r.errors, r.errors
        assert r.completion_tokens == N_TOKENS and r.text == reference[p]
    counts = wait_idle(backend.instances, timeout=30)  # reservations of aborted migrations expire
    assert len(counts) == 1 and all(c["num_used_blocks"] == 0 and c["num_requests"] == 0
                                    for c in counts.values()), (counts, seen)


def test_when_no_instance_is_left_the_stream_ends_with_a_clear_error(server, cluster, model_name):
    """Runs last: it kills the last instance."""
    url, backend = server
    (last,) = backend.instances

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            pr = StreamResult()
            task = asyncio.create_task(stream_completion(c, url, {**_body("doomed"), "model": model_name}, pr))
            while pr.num_chunks < 5 and not pr.done:
                await asyncio.sleep(0.005)
            ray.kill(backend.instances[last])
            t0 = time.time()
            res = await asyncio.wait_for(task, 30)
            return res, time.time() - t0

    res, took = asyncio.run(main())
    assert res.errors and "failed" in res.errors[0] and res.done, res
    assert took < 15
    r = httpx.post(f"{url}/v1/completions", json={**_body("nobody", 4), "model": model_name}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["message"]
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "unavailable"  # probes see it
