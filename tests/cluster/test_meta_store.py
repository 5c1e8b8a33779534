from __future__ import annotations

import pytest

from llumnix.cluster.meta_store import (
    MemoryMetaStore,
    RedisMetaStore,
    make_meta_store,
    status_from_json,
    status_to_json,
)
from llumnix.core.status import InstanceStatus, RequestBrief


def _status(iid: str, t: float, used: int = 3) -> InstanceStatus:
    return InstanceStatus(
        instance_id=iid, timestamp=t, num_total_blocks=10, num_used_blocks=used,
        num_watermark_blocks=1, block_size=16, max_num_seqs=8,
        running=(RequestBrief("r1", 1, 3, 40, 0.5, True),),
        waiting=(RequestBrief("r2", 0, 0, 9, 0.7, False),), head_of_line_demand=1,
    )


def test_json_round_trip_is_exact():
    s = _status("a", 1.5)
    assert status_from_json(status_to_json(s)) == s


def test_evicted_prefix_keys_are_an_event_the_store_leaves_out():
    import dataclasses

    s = dataclasses.replace(_status("a", 1.5), evicted_prefix_keys=(b"\x01" * 16,))
    assert status_from_json(status_to_json(s)) == _status("a", 1.5)


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        return MemoryMetaStore()
    url = request.getfixturevalue("redis_url")
    st = RedisMetaStore(url, prefix=f"test-{id(request)}")
    assert st.ping()
    return st


def test_store_keeps_the_newest_status(store):
    store.put_status(_status("a", 2.0, used=5))
    store.put_status(_status("a", 1.0, used=9))  # late, older report
    store.put_status(_status("b", 1.0))
    assert store.get_status("a").num_used_blocks == 5
    assert set(store.all_statuses()) == {"a", "b"}
    store.remove("a")
    assert store.get_status("a") is None and set(store.all_statuses()) == {"b"}


def test_two_clients_share_one_view(redis_url):
    one, two = RedisMetaStore(redis_url, "shared"), RedisMetaStore(redis_url, "shared")
    one.put_status(_status("x", 3.0))
    assert two.get_status("x") == _status("x", 3.0)


def test_make_meta_store_rejects_unknown_urls():
    assert isinstance(make_meta_store(None), MemoryMetaStore)
    with pytest.raises(ValueError, match="--cms"):
        make_meta_store("mysql://nope")


def test_a_url_loses_its_password_in_messages():
    from llumnix.cluster.meta_store import redact_url

    assert redact_url("redis://:hunter2@127.0.0.1:6379/0") == "redis://***@127.0.0.1:6379/0"
    assert redact_url("rediss://user:hunter2@cms.example:6380") == "rediss://***@cms.example:6380"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    with pytest.raises(ValueError) as e:
        make_meta_store("mysql://root:hunter2@db/x")
    assert "hunter2" not in str(e.value)


def test_serve_refuses_an_unreachable_store_without_echoing_its_password():
    from llumnix.cluster.serve import _check_reachable_parts
    from llumnix.core.errors import LlumnixError

    with pytest.raises(LlumnixError) as e:
        _check_reachable_parts("smollm2", "redis://:hunter2@127.0.0.1:1/0")
    assert "hunter2" not in str(e.value) and "127.0.0.1:1" in str(e.value)


def _wait(pred, timeout=5.0):
    import time

    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def test_the_writer_never_blocks_on_a_hung_redis_and_catches_up_when_it_is_back(caplog):
    import os
    import signal
    import time

    from llumnix.cluster.meta_store import StoreWriter
    from tests.cluster.conftest import redis_server

    with redis_server() as (url, proc):
        reader = RedisMetaStore(url, prefix="w")
        writer = StoreWriter(RedisMetaStore(url, prefix="w", timeout_s=0.3), retry_s=0.1)
        writer.put_status(_status("a", 1.0))
        assert writer.flush() and reader.get_status("a").timestamp == 1.0
        os.kill(proc.pid, signal.SIGSTOP)  # hung: accepts bytes, answers nothing
        try:
            t0 = time.perf_counter()
            for i in range(200):
                writer.put_status(_status("a", 2.0 + i, used=i % 10))
            took = time.perf_counter() - t0
            assert _wait(lambda: not writer.is_reachable)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert took < 0.05  # 200 pushes, none waited on Redis
        assert writer.flush(10) and _wait(lambda: reader.get_status("a").timestamp == 201.0)
        assert writer.is_reachable
        lines = [r.getMessage() for r in caplog.records if "meta store" in r.getMessage()]
        assert any("unreachable" in m for m in lines) and any("reachable again" in m for m in lines)
        assert len(lines) == 2  # one line when it went, one when it came back
        writer.close()


def test_the_writer_rewrites_a_restarted_redis():
    from llumnix.cluster.meta_store import StoreWriter
    from llumnix.cluster.startup import free_port
    from tests.cluster.conftest import redis_server

    port = free_port()
    with redis_server(port) as (url, _):
        writer = StoreWriter(RedisMetaStore(url, prefix="r", timeout_s=0.3), retry_s=0.1)
        writer.put_status(_status("a", 1.0))
        writer.put_member("a", {"actor_name": "llumnix-llumsched-a"})
        assert writer.flush()
    writer.put_status(_status("a", 2.0))  # Redis is down now
    assert _wait(lambda: not writer.is_reachable)
    with redis_server(port) as (url, _):  # back, empty
        writer.put_status(_status("b", 3.0))
        assert writer.flush(10)
        assert set(RedisMetaStore(url, prefix="r").all_statuses()) == {"a", "b"}
        # membership is written once by a llumlet: the writer writes it again (the soak lost
        # it to a Redis restart, and a LlumSched restarted after that found no members)
        assert RedisMetaStore(url, prefix="r").members() == {"a": {"actor_name": "llumnix-llumsched-a"}}
    writer.close()
