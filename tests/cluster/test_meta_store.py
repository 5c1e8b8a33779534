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
