"""Reading and writing a request's KV blocks for migration with as few copies as
the executor allows, and running copy threads at low OS priority.

With a CPU cache tensor laid out ``[layers, 2, blocks, block, kv_heads, head_dim]``
a block list is, byte for byte, what ``gather_blocks`` would produce if read as
(layer, k/v) rows of block runs::

    row (l, kv):  | b3 b4 b5 | b9 |      consecutive ids merge into one run
    stream:       row(0,K) row(0,V) row(1,K) ... row(L-1,V)

so a sender can hand the socket views of the cache itself, and a receiver can
``recv_into`` the reserved blocks directly: no gather, no scatter, no buffer.
Other executors (a GPU cache, the test fakes) fall back to one gather / one scatter.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)


def lower_thread_priority(nice: int, idle: bool = False) -> None:
    """Nice the calling thread (Linux: a thread is a schedulable task), so copies
    yield the cores to the engines' compute threads; with ``idle``, also put it in
    ``SCHED_IDLE``, where it runs only on a core no normal thread wants. Unprivileged
    processes can never raise either back: call it only on threads dedicated to bulk
    copies."""
    tid = threading.get_native_id()
    if nice > 0 and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))
        except OSError:  # not permitted here: copies run at normal priority
            log.debug("could not lower the copy thread's priority", exc_info=True)
    if idle and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            log.debug("could not put the copy thread in SCHED_IDLE", exc_info=True)


def _cpu_cache(executor: Any) -> Any | None:
    """The executor's KV cache as a flat uint8 numpy array, if it is a contiguous CPU tensor."""
    cache = getattr(executor, "kv_cache", None)
    if cache is None or not hasattr(cache, "is_contiguous"):
        return None
    if cache.device.type != "cpu" or not cache.is_contiguous() or cache.dim() != 6:
        return None
    import torch

    return cache.view(-1).view(torch.uint8).numpy()


def _runs(block_ids: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs


def block_views(executor: Any, block_ids: list[int]) -> list[memoryview] | None:
    """Views of the cache holding ``block_ids`` in gather order, or None if the
    executor's cache cannot be viewed (then use gather/scatter)."""
    flat = _cpu_cache(executor)
    if flat is None:
        return None
    cache = executor.kv_cache
    num_rows, num_blocks = cache.shape[0] * cache.shape[1], cache.shape[2]
    row_block = len(flat) // (num_rows * num_blocks)  # bytes of one block in one row
    mv = memoryview(flat).cast("B")
    runs = _runs(block_ids)
    views = []
    for r in range(num_rows):
        base = r * num_blocks * row_block
        for lo, hi in runs:
            views.append(mv[base + lo * row_block: base + hi * row_block])
    return views


def scratch(nbytes: int) -> memoryview:
    """A writable buffer of ``nbytes`` for a payload that cannot land in the cache itself
    (a GPU cache): uninitialised. ``bytearray(n)`` zero-fills every page while holding the
    GIL (measured here: 170-250 ms for 200 MB, during which a Python thread such as an
    engine's step loop cannot run); numpy maps the pages lazily and the socket fills them
    with the GIL released."""
    import numpy as np

    return np.empty(nbytes, dtype=np.uint8).data


def gather(executor: Any, block_ids: list[int]) -> memoryview:
    """The blocks as one contiguous buffer (one copy)."""
    data = executor.gather_blocks(block_ids)
    return data if isinstance(data, memoryview) else memoryview(data)


def is_viewable(executor: Any) -> bool:
    return _cpu_cache(executor) is not None


def scatter(executor: Any, block_ids: list[int], data: memoryview | bytes | bytearray) -> None:
    """Write a gathered buffer into ``block_ids`` (the executor's ``scatter_blocks``: one
    copy, even from a read-only buffer)."""
    if not block_ids:
        return
    executor.scatter_blocks(block_ids, data)
