"""Random workloads never break the engine's accounting, and it always drains."""
from __future__ import annotations

import contextlib

from hypothesis import given, settings
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


@settings(max_examples=80, deadline=None)
@given(st.lists(op, max_size=80), st.integers(8, 40))
def test_random_workload_keeps_invariants_and_drains(ops, num_blocks):
    eng = make_engine(num_blocks=num_blocks, block_size=4, max_num_seqs=4, max_batched=48)
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
