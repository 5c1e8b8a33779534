"""The shared meta store (Redis) as the cluster's source of truth (issue 29, item 1): the
llumlets write their statuses there, a restarted LlumSched resumes from it at once, and a
gateway reads the same view (``/admin/cluster``, its fallback dispatch) while LlumSched is
away. A real redis-server, a real cluster."""
from __future__ import annotations

import time

import httpx
import pytest

from llumnix.cluster.llumsched import LLUMSCHED_NAME
from tests.cluster.conftest import redis_server
from tests.cluster.helpers import ADMIN, running_cluster, serve_cluster, wait_idle

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def redis():
    with redis_server() as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, redis):
    with running_cluster(tiny_model_dir, "cms", instances=2, cms=redis[0], engine={"num_blocks": 300}) as c:
        yield c


def _members(url: str) -> dict:
    from llumnix.cluster.meta_store import RedisMetaStore

    store = RedisMetaStore(url)
    return {"members": store.members(), "statuses": store.all_statuses()}


def test_the_llumlets_write_their_statuses_and_membership_to_the_store(cluster, redis):
    deadline = time.time() + 10
    while time.time() < deadline:
        view = _members(redis[0])
        if set(view["statuses"]) == {"instance-0", "instance-1"}:
            break
        time.sleep(0.1)
    assert set(view["statuses"]) == {"instance-0", "instance-1"}
    assert all(time.time() - s.timestamp < 5 for s in view["statuses"].values())  # heartbeats
    assert {iid: m["actor_name"] for iid, m in view["members"].items()} == {
        f"instance-{i}": f"{LLUMSCHED_NAME}-instance-{i}" for i in range(2)}


def test_a_restarted_llumsched_resumes_from_the_store_without_relearning(cluster):
    first = ray.get(cluster.llumsched.cluster_info.remote(), timeout=10)
    assert first["num_resumed_from_cms"] == 0  # started before any instance
    ray.kill(cluster.llumsched, no_restart=False)
    deadline = time.time() + 30
    info: dict = {}
    while time.time() < deadline:
        try:
            info = ray.get(cluster.llumsched.cluster_info.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - still restarting
            time.sleep(0.05)
            continue
        if info["started_at"] != first["started_at"]:
            break
    # the new incarnation's constructor read both instances from the store: it did not
    # wait for their pushes to learn them
    assert info["started_at"] != first["started_at"] and info["num_resumed_from_cms"] == 2
    from llumnix.policy import DispatchRequest

    members = ray.get(cluster.llumsched.members.remote(), timeout=10)
    assert set(members) == {"instance-0", "instance-1"}
    assert ray.get(cluster.llumsched.dispatch.remote(DispatchRequest("after-restart", 5)), timeout=10) in members


def test_a_gateway_reads_the_shared_view_while_llumsched_is_away(cluster, tiny_model_dir):
    with serve_cluster(cluster, tiny_model_dir) as (url, backend):
        deadline = time.time() + 10
        while backend.cms.store is None and time.time() < deadline:
            time.sleep(0.05)
        assert backend.cms.store is not None
        name = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        assert httpx.post(f"{url}/admin/instances/instance-0/drain", headers=ADMIN, timeout=10).status_code == 200
        real = backend.llumsched

        class Away:  # LlumSched not answering (restarting, or its node lost)
            class _Fail:
                @staticmethod
                def remote(*a, **kw):
                    raise ray.exceptions.RayActorError()

            submit = dispatch = cluster_info = members = cms_url = capacity = _Fail

        try:
            time.sleep(0.5)  # the drained instance's status (terminating) reaches the store
            backend.llumsched = Away()
            info = httpx.get(f"{url}/admin/cluster", headers=ADMIN, timeout=10).json()
            assert info["source"] == "cms"
            assert {i["instance_id"]: i["is_terminating"] for i in info["instances"]} == {
                "instance-0": True, "instance-1": False}
            local = backend.num_local_dispatches
            for i in range(2):  # the gateway's own dispatch sees the drain on the channel's statuses
                r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": f"own {i}", "max_tokens": 3,
                                                               "ignore_eos": True}, timeout=60)
                assert r.status_code == 200, r.text
            assert backend.num_local_dispatches == local + 2
            gs, backend.gs = backend.gs, None  # no dispatch state of its own: the store's view
            try:
                for i in range(4):  # round-robin would send two of these to the drained instance
                    r = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": f"cms {i}",
                                                                   "max_tokens": 3, "ignore_eos": True}, timeout=60)
                    assert r.status_code == 200, r.text
            finally:
                backend.gs = gs
            assert backend.cms.num_dispatches == 4
            steps = ray.get(cluster.instances["instance-0"].step_log.remote(), timeout=10)
            assert not steps, "a request reached the drained instance"
        finally:
            backend.llumsched = real
            httpx.post(f"{url}/admin/instances/instance-0/undrain", headers=ADMIN, timeout=10)
        wait_idle(cluster.instances)


def test_a_restarted_redis_is_rewritten_by_the_llumlets(cluster, redis):
    import os
    import signal

    url, proc = redis
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # every writer notices, keeps its newest status
    with redis_server(port) as (url2, _):  # back, empty
        deadline = time.time() + 10
        while time.time() < deadline and set(_members(url2)["statuses"]) != {"instance-0", "instance-1"}:
            time.sleep(0.1)
        assert set(_members(url2)["statuses"]) == {"instance-0", "instance-1"}
