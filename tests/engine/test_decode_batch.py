"""A decode step carries a DecodeBatch and builds its entries only when read: they must be
the entries every request would get from the scheduler's general path, even when read
after the step's update."""
from __future__ import annotations

import dataclasses

import pytest

from llumnix.core.batch import ModelOutput, SchedulerOutput
from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine


def _fields(e):
    return (e.request_id, list(e.token_ids), e.start_pos, list(e.block_ids), e.seed, e.output_index,
            e.banned_token_ids, e.sample)


def _decoding_engine():
    eng = make_engine()
    eng.add_request("a", [1, 2, 3], SamplingParams(max_tokens=8, min_tokens=4, stop_token_ids=[7]))
    eng.add_request("b", list(range(1, 20)), SamplingParams(max_tokens=8))
    batch = eng.schedule()
    assert batch.is_prefill
    eng.update(batch, eng.executor.execute(batch))
    return eng


def test_decode_entries_equal_the_general_entries():
    eng = _decoding_engine()
    batch = eng.schedule()
    assert not batch.is_prefill and batch.decode is not None
    expected = [_fields(eng.scheduler._entry(r)) for r in eng.scheduler.running]
    assert [_fields(e) for e in batch.scheduled] == expected
    assert batch.request_ids == ["a", "b"] and batch.num_entries == 2
    assert batch.decode.num_context_tokens == sum(e.start_pos + 1 for e in batch.scheduled)


def test_decode_entries_read_after_the_update_are_those_of_the_schedule():
    eng = _decoding_engine()
    batch = eng.schedule()
    expected = [_fields(eng.scheduler._entry(r)) for r in eng.scheduler.running]
    outputs = eng.update(batch, ModelOutput(sampled_token_ids=[5, 6]))  # no entry read yet
    assert [o.new_token_ids for o in outputs] == [[5], [6]]
    assert [eng.requests[r].num_computed_tokens for r in ("a", "b")] == [e[2] + 1 for e in expected]
    assert [_fields(e) for e in batch.scheduled] == expected


def _request_fields(eng):
    return {rid: {f.name: getattr(r, f.name) for f in dataclasses.fields(r)} for rid, r in eng.requests.items()}


@pytest.mark.parametrize("caching", [False, True])
def test_a_decode_step_updates_as_its_entries_would(caching):
    """``update`` takes a decode step without logprobs on a path of its own (no entry is
    read): every output and every request's fields must be those the general path gives
    the same step's entries. Two like engines, stepped alike; one is handed each decode
    step as its entries. EOS, stop ids, min_tokens, lengths, preemptions, a request
    aborted and one paused while a step runs."""
    def build():
        eng = make_engine(num_blocks=20, block_size=4, eos=5, prefix_caching=caching, max_num_seqs=6)
        for i in range(8):
            params = SamplingParams(max_tokens=6 + 3 * i, min_tokens=i % 3, stop_token_ids=(7,) if i % 2 else (),
                                    ignore_eos=i == 4, seed=i)
            eng.add_request(f"r{i}", [1, 2, 3, 4, 5, 6][: 2 + i % 5] + [i], params)
        return eng

    fast, slow = build(), build()
    decodes, paused_at = 0, None
    for step in range(200):
        if not fast.has_unfinished_requests():
            break
        a, b = fast.schedule(), slow.schedule()
        out_a, out_b = fast.executor.execute(a), slow.executor.execute(b)
        assert out_a.sampled_token_ids == out_b.sampled_token_ids
        if b.decode is not None:
            decodes += 1
            b = SchedulerOutput(b.scheduled, is_prefill=False, preempted_request_ids=b.preempted_request_ids)
            running = [r.request_id for r in fast.scheduler.running]
            if paused_at is None and step >= 4 and len(running) > 2:  # while the step runs
                paused_at = step
                for eng in (fast, slow):
                    eng.abort_request(running[0])
                    eng.pause_request(running[1])
        assert fast.update(a, out_a) == slow.update(b, out_b)
        if paused_at is not None and step == paused_at + 2:
            for eng in (fast, slow):
                for rid in list(eng.scheduler.paused):
                    eng.resume_request(rid)
        assert _request_fields(fast) == _request_fields(slow)
        for eng in (fast, slow):
            eng.check_invariants()
            eng.clock.advance_to(eng.clock.now() + 0.01)
    assert not fast.has_unfinished_requests() and not slow.has_unfinished_requests()
    assert decodes >= 20 and paused_at is not None and fast.scheduler.num_preemptions > 0
