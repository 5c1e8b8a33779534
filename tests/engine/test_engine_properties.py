"""Random workloads never break the engine's accounting, and it always drains."""
from __future__ import annotations

import contextlib

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from llumnix.core.errors import RequestTooLongError
from llumnix.core.request import RequestStatus
from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine

op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 20), st.integers(0, 1)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0), st.just(0)),
    st.tuples(st.just("abort"), st.integers(0, 20), st.just(0), st.just(0)),
    st.tuples(st.just("preempt"), st.integers(0, 20), st.just(0), st.just(0)),
    st.tuples(st.just("pause"), st.integers(0, 20), st.integers(0, 1), st.just(0)),
)


@pytest.mark.parametrize(("prefix_caching", "chunked"), [(False, False), (True, False), (False, True), (True, True)])
@settings(max_examples=80, deadline=None)
@given(ops=st.lists(op, max_size=80), num_blocks=st.integers(8, 40))
def test_random_workload_keeps_invariants_and_drains(ops, num_blocks, prefix_caching, chunked):
    eng = make_engine(num_blocks=num_blocks, block_size=4, max_num_seqs=4,
                      max_batched=6 if chunked else 48, prefix_caching=prefix_caching, chunked=chunked)
    n = 0
    for kind, a, b, c in ops:
        if kind == "add":
            # too long for this pool: rejected at admission, never queued
            with contextlib.suppress(RequestTooLongError):
                eng.add_request(f"r{n}", [1 + (n % 7)] * a, SamplingParams(max_tokens=b), priority=c)
            n += 1
        elif kind == "step":
            for _ in range(a):
                eng.step()
        elif kind == "abort":
            eng.abort_request(f"r{a}")
        elif kind == "preempt":
            req = eng.requests.get(f"r{a}")
            if req is not None and req.status == RequestStatus.RUNNING:
                eng.scheduler.preempt(req)
        elif kind == "pause":
            req = eng.requests.get(f"r{a}")
            if req is not None and req.status == RequestStatus.RUNNING and b:
                eng.pause_request(req.request_id)
            elif req is not None and req.status == RequestStatus.PAUSED:
                eng.resume_request(req.request_id)
        eng.check_invariants()
    for rid in list(eng.scheduler.paused):
        eng.resume_request(rid)
    for _ in range(5000):
        if not eng.has_unfinished_requests():
            break
        eng.step()
        eng.check_invariants()
    assert not eng.has_unfinished_requests()
    assert eng.kv.num_free_blocks == num_blocks


prompt = st.tuples(st.integers(0, 3), st.integers(1, 24), st.integers(1, 12))
"""(which of four shared prefixes, its length, the output length)."""


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("add"), prompt), st.tuples(st.just("add"), prompt),
                          st.tuples(st.just("step"), st.integers(1, 5)),
                          st.tuples(st.just("preempt"), st.integers(0, 30))), max_size=60),
       st.integers(12, 40))
def test_prefix_caching_changes_no_output(ops, num_blocks):
    """The fake executor's tokens hash every token read back through the block table, so a
    shared block that held the wrong tokens, or was written by a second request, changes
    the output. Same workload with and without the cache: the same tokens for every request."""
    prefixes = [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [5, 6, 7, 8, 1, 2, 3, 4] * 3, [9] * 24, [1, 2, 3] * 8]

    def run(caching: bool) -> tuple[dict[str, list[int]], int]:
        eng = make_engine(num_blocks=num_blocks, block_size=4, max_num_seqs=4, max_batched=48,
                          prefix_caching=caching)
        outs: dict[str, list[int]] = {}

        def collect(batch) -> None:
            for o in batch:
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)

        n = 0
        for kind, arg in ops:
            if kind == "add":
                which, length, out_len = arg  # type: ignore[misc]
                with contextlib.suppress(RequestTooLongError):
                    eng.add_request(f"r{n}", prefixes[which][:length] + [n], SamplingParams(max_tokens=out_len))
                n += 1
            elif kind == "step":
                for _ in range(arg):  # type: ignore[arg-type]
                    collect(eng.step())
            else:
                req = eng.requests.get(f"r{arg}")
                if req is not None and req.status == RequestStatus.RUNNING:
                    eng.scheduler.preempt(req)
            eng.check_invariants()
        while eng.has_unfinished_requests():
            collect(eng.step())
            eng.check_invariants()
        assert eng.kv.num_free_blocks == num_blocks
        return outs, eng.kv.prefix.num_hit_tokens if eng.kv.prefix else 0

    plain, _ = run(False)
    with_cache, cached = run(True)
    event("some prompt tokens came from the cache" if cached else "no cache hit")
    assert with_cache == plain


def test_prefix_caching_reuses_blocks_and_skips_their_compute():
    eng = make_engine(num_blocks=32, block_size=4, prefix_caching=True)
    shared = list(range(100, 114))  # 14 tokens: 3 full blocks
    eng.add_request("a", shared + [1, 2], SamplingParams(max_tokens=3))
    eng.step()  # a's prefill: its 4 full blocks are now cached
    eng.add_request("b", shared + [7], SamplingParams(max_tokens=3))
    batch = eng.schedule()
    (entry,) = batch.scheduled
    assert batch.is_prefill and entry.request_id == "b"
    assert entry.start_pos == 12 and entry.token_ids == shared[12:] + [7]  # 3 blocks from the cache
    assert eng.requests["b"].num_cached_tokens == 12
    assert eng.kv.block_table("b")[:3] == eng.kv.block_table("a")[:3]
    eng.update(batch, eng.executor.execute(batch))
    eng.check_invariants()
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_invariants()
    # Everything released: the cached blocks count as free and are still findable.
    assert eng.kv.num_free_blocks == 32 and eng.kv.prefix is not None and len(eng.kv.prefix.evictable) >= 4
    eng.add_request("c", shared + [1, 2, 9], SamplingParams(max_tokens=1))
    (entry,) = eng.schedule().scheduled
    assert entry.start_pos == 16  # a's 4 full blocks (prompt 16 tokens) still there
