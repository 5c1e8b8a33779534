"""Zero-copy KV views: byte for byte what gather/scatter move, on a real CPU cache."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from llumnix.migration.kv_io import block_views, gather, is_viewable, lower_thread_priority, scatter
from llumnix.migration.transport import KVSource, split
from llumnix.model.executor import ModelExecutor
from tests.fakes import TokenCacheExecutor


def cpu_executor(num_blocks=12, seed=0):
    """A ModelExecutor's cache and KV methods, without a model (none is needed to move KV)."""
    ex = ModelExecutor.__new__(ModelExecutor)
    g = torch.Generator().manual_seed(seed)
    ex.kv_cache = ex._storage = torch.randn(3, 2, num_blocks, 4, 2, 8, generator=g)
    ex.device, ex.dtype = torch.device("cpu"), torch.float32
    return ex


def test_views_are_the_gathered_bytes_in_order():
    ex = cpu_executor()
    for ids in ([0], [3, 4, 5], [7, 2, 3, 9], [11, 10, 0, 1, 2]):
        views = block_views(ex, ids)
        assert views is not None
        assert b"".join(bytes(v) for v in views) == bytes(ex.gather_blocks(ids))
        assert b"".join(bytes(v) for v in split(views, 100)) == bytes(ex.gather_blocks(ids))


def test_writing_into_views_and_scattering_both_copy_blocks_exactly():
    src, dst_views, dst_scatter = cpu_executor(seed=1), cpu_executor(seed=2), cpu_executor(seed=3)
    ids_src, ids_dst = [5, 6, 1], [9, 2, 3]
    data = bytes(gather(src, ids_src))
    pos = 0
    for v in block_views(dst_views, ids_dst):
        v[:] = data[pos:pos + len(v)]
        pos += len(v)
    scatter(dst_scatter, ids_dst, memoryview(data).toreadonly())
    for d in (dst_views, dst_scatter):
        assert torch.equal(d.kv_cache[:, :, ids_dst], src.kv_cache[:, :, ids_src])
    untouched = [b for b in range(12) if b not in ids_dst]
    assert torch.equal(dst_views.kv_cache[:, :, untouched], cpu_executor(seed=2).kv_cache[:, :, untouched])


def test_executors_without_a_cpu_cache_fall_back_to_gather():
    ex = TokenCacheExecutor(8, 4)
    assert not is_viewable(ex) and block_views(ex, [1]) is None
    assert bytes(KVSource(ex, [1, 2]).views()[0]) == ex.gather_blocks([1, 2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_a_bulk_copy_thread_lowers_only_its_own_priority():
    seen = {}

    def copier():
        lower_thread_priority(19, idle=True)
        tid = threading.get_native_id()
        seen["nice"], seen["policy"] = os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(0)
    t = threading.Thread(target=copier)
    t.start()
    t.join()
    assert seen == {"nice": 19, "policy": os.SCHED_IDLE}
    assert (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.sched_getscheduler(0)) == before
