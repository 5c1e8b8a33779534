"""A real cluster: Ray actors, LlumSched, the FastAPI gateway over HTTP (uvicorn)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, redis_url):
    from llumnix.cluster.launcher import ClusterConfig, start_cluster

    cfg = ClusterConfig(model=str(tiny_model_dir), instances=2, cms=redis_url,
                        engine={"num_blocks": 512, "block_size": 4, "max_num_seqs": 8},
                        namespace=f"test-{time.time_ns()}", reschedule_interval_s=0.05)
    c = start_cluster(cfg)
    yield c
    c.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def server(cluster, tiny_model_dir):
    import uvicorn

    from llumnix.cluster.backend import ClusterBackend
    from llumnix.gateway.app import build_app
    from llumnix.model import Tokenizer

    tok = Tokenizer.from_dir(tiny_model_dir, None, 256)
    backend = ClusterBackend(cluster.llumsched, cluster.instances, cluster.info, tok)
    app = build_app(backend)

    @app.on_event("startup")
    async def _start() -> None:
        await backend.start()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", backend
    srv.should_exit = True
    th.join(10)


def test_completions_over_http_through_the_cluster(server):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 8,
                                                   "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8


def test_concurrent_streams_spread_over_instances_and_complete(server, cluster):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]

    async def one(i: int) -> int:
        async with httpx.AsyncClient(timeout=60) as c, c.stream(
                "POST", f"{url}/v1/completions",
                json={"model": name, "prompt": f"request {i}", "max_tokens": 12, "ignore_eos": True,
                      "stream": True}) as r:
            chunks = [json.loads(ln[6:]) async for ln in r.aiter_lines()
                      if ln.startswith("data: ") and ln != "data: [DONE]"]
        return chunks[-1]["usage"]["completion_tokens"]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(main()) == [12] * 8
    info = httpx.get(f"{url}/admin/cluster").json()
    assert info["num_dispatched"] >= 9
    assert all(i["age_s"] < 5 for i in info["instances"])
    # every instance got work, and every block came back
    time.sleep(0.3)
    statuses = ray.get([a.status.remote() for a in cluster.instances.values()])
    assert all(s.num_used_blocks == 0 for s in statuses)


def test_bad_request_never_reaches_an_instance(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={"model": "x", "prompt": "hi"})
    assert r.status_code == 404
    r = httpx.post(f"{url}/v1/completions", json={"model": httpx.get(f"{url}/v1/models").json()["data"][0]["id"],
                                                  "prompt": "hi" * 600, "max_tokens": 5})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_statuses_reach_the_shared_redis_meta_store(server, redis_url):
    from llumnix.cluster.meta_store import RedisMetaStore

    statuses = RedisMetaStore(redis_url).all_statuses()
    assert set(statuses) == {"instance-0", "instance-1"}
    assert all(time.time() - s.timestamp < 10 for s in statuses.values())


def test_client_disconnect_aborts_and_frees_kv(server, cluster):
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    with httpx.stream("POST", f"{url}/v1/completions", timeout=30,
                      json={"model": name, "prompt": "bye", "max_tokens": 450, "ignore_eos": True,
                            "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # got the first token; hang up
    deadline = time.time() + 10
    while time.time() < deadline:
        statuses = ray.get([a.status.remote() for a in cluster.instances.values()])
        if all(not s.running and not s.waiting and s.num_used_blocks == 0 for s in statuses):
            break
        time.sleep(0.1)
    assert all(not s.running and s.num_used_blocks == 0 for s in statuses)
    assert "llumnix:requests_aborted_total" in httpx.get(f"{url}/metrics").text
    aborted = [ln for ln in httpx.get(f"{url}/metrics").text.splitlines()
               if ln.startswith("llumnix:requests_aborted_total")]
    assert aborted and float(aborted[0].split()[-1]) >= 1


def test_health(server):
    url, _ = server
    h = httpx.get(f"{url}/health").json()
    assert h["status"] == "ok" and all(h["instances"].values())


def test_gateway_falls_back_when_llumsched_does_not_answer(server):
    url, backend = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    real = backend.llumsched

    class Dead:
        class dispatch:  # noqa: N801 - mimics an actor method
            @staticmethod
            def remote(*a, **kw):
                raise ray.exceptions.RayActorError()

        cluster_info = real.cluster_info

    backend.llumsched = Dead()
    try:
        t0 = time.time()
        r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 200 and backend.num_fallback_dispatches >= 1
        assert time.time() - t0 < 10
    finally:
        backend.llumsched = real


def test_silent_unresponsive_instance_is_marked_unschedulable():
    """The health-check pull, on a LlumSched with a stub instance that never answers."""
    from llumnix.cluster.actors import LlumSchedActor
    from llumnix.core.status import InstanceStatus
    from llumnix.policy import DispatchRequest

    @ray.remote(num_cpus=0)
    class Frozen:
        def health(self) -> bool:
            time.sleep(60)
            return True

    sched = LlumSchedActor.options(num_cpus=0).remote(None, None, reschedule_interval_s=0.05)
    old = InstanceStatus("frozen", time.time() - 10, 100, 0, 1, 16, 8)
    ray.get(sched.register.remote(old, Frozen.remote()))
    deadline = time.time() + 15
    while time.time() < deadline:
        if ray.get(sched.dispatch.remote(DispatchRequest("r", 5))) is None:
            break
        time.sleep(0.2)
    assert ray.get(sched.dispatch.remote(DispatchRequest("r2", 5))) is None
    ray.kill(sched)


def test_llumsched_is_restarted_by_ray_and_relearns_the_instances(server, cluster):
    url, backend = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    ray.kill(cluster.llumsched, no_restart=False)
    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200  # served meanwhile (fallback or the restarted scheduler)
    deadline = time.time() + 30
    info = {}
    while time.time() < deadline:
        try:
            info = ray.get(cluster.llumsched.cluster_info.remote(), timeout=5)
            if len(info["instances"]) == 2:
                break
        except Exception:  # noqa: BLE001 - still restarting
            pass
        time.sleep(0.2)
    assert len(info["instances"]) == 2
    before = info["num_dispatched"]
    httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "y", "max_tokens": 4}, timeout=30)
    assert ray.get(cluster.llumsched.cluster_info.remote())["num_dispatched"] == before + 1


def test_drain_migrates_running_requests_and_streams_survive(server, cluster):
    """Runs last: it leaves instance-1 terminating."""
    url, _ = server
    name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    n_tokens = 480

    async def one(i: int) -> list[str]:
        async with httpx.AsyncClient(timeout=120) as c, c.stream(
                "POST", f"{url}/v1/completions",
                json={"model": name, "prompt": f"r{i}", "max_tokens": n_tokens, "ignore_eos": True,
                      "temperature": 0, "stream": True}) as r:
            return [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]

    async def main():
        tasks = [asyncio.create_task(one(i)) for i in range(4)]
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{url}/admin/instances/instance-1/drain")
            assert r.status_code == 200, r.text
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    for lines in results:
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == n_tokens
    deadline = time.time() + 5
    while time.time() < deadline:
        info = httpx.get(f"{url}/admin/cluster").json()
        if not info["migrations"]["in_flight"]:
            break
        time.sleep(0.1)
    assert info["migrations"]["committed"] >= 1, info
    text = httpx.get(f"{url}/metrics").text
    assert 'llumnix:migrations{model_name=' in text and "llumnix:migration_downtime_seconds_count" in text
    assert 'llumnix:instance_freeness{instance_id="instance-0"' in text
    statuses = {s.instance_id: s for s in ray.get([a.status.remote() for a in cluster.instances.values()])}
    assert statuses["instance-1"].is_terminating and not statuses["instance-1"].running
    assert all(s.num_used_blocks == 0 for s in statuses.values())
