"""On a real two-instance cluster (Ray, the tiny model): an order that names its request
(a rescue's, ``policy/slo_rescue.py``), sent to the source as LlumSched's rescheduler sends
it (``InstanceActor.migrate_out`` with the name), moves that request and no other, one the
source's own selection would not have picked; an order naming a request no longer there
moves nothing and says why in LlumSched's migration log. LlumSched's own passes pair
nothing (rescheduling off), so every move here is the test's."""
from __future__ import annotations

import time

import pytest

from tests.cluster.helpers import running_cluster, where_is

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

NUM = 4


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    with running_cluster(tiny_model_dir, "named", instances=2,
                         scheduling={"rescheduling": {"enabled": False}}) as c:
        yield c


def test_a_named_order_moves_that_request_and_no_other(cluster):
    import ray

    from llumnix.core.sampling_params import SamplingParams
    from llumnix.core.wire import GenerateRequest
    from llumnix.policy.selection import select_requests

    src, dst = (cluster.instances[i] for i in ("instance-0", "instance-1"))
    params = SamplingParams(max_tokens=3000, ignore_eos=True)
    ids = [f"named-{i}" for i in range(NUM)]
    ray.get([src.add_request.remote(GenerateRequest(rid, [7 + i] * 8, params, 0, time.time(), client="t"))
             for i, rid in enumerate(ids)])
    deadline = time.time() + 60
    while len(ray.get(src.status.remote(), timeout=30).running) < NUM:
        assert time.time() < deadline, "the requests never all ran"
        time.sleep(0.05)
    status = ray.get(src.status.remote(), timeout=30)
    chosen = select_requests(status, "paper", 1)
    named = next(rid for rid in reversed(ids) if rid not in chosen)  # not the selection's pick
    reports = ray.get(src.migrate_out.remote("instance-1", dst, None, named), timeout=120)
    assert [(r["request_id"], r["committed"]) for r in reports] == [(named, True)], reports
    assert where_is(cluster.instances, named) == "instance-1"
    assert all(where_is(cluster.instances, rid) == "instance-0" for rid in ids if rid != named)

    gone = ray.get(src.migrate_out.remote("instance-1", dst, None, "finished-long-ago"), timeout=60)
    assert [(r["request_id"], r["committed"], r["abort_code"]) for r in gone] == [
        ("finished-long-ago", False, "source_finished")], gone
    assert "is not on instance-0" in gone[0]["abort_reason"]
    deadline = time.time() + 30
    while True:  # LlumSched's log has it (told as it ended)
        recent = ray.get(cluster.llumsched.cluster_info.remote(), timeout=30)["migrations"]["recent"]
        if any(m["request_id"] == "finished-long-ago" for m in recent):
            break
        assert time.time() < deadline, recent
        time.sleep(0.1)
    assert all(where_is(cluster.instances, rid) == "instance-0" for rid in ids if rid != named)
    for a, rids in ((src, [r for r in ids if r != named]), (dst, [named])):
        ray.get([a.abort.remote(rid) for rid in rids], timeout=30)
