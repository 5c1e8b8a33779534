"""A decode step carries a DecodeBatch and builds its entries only when read: they must be
the entries every request would get from the scheduler's general path, even when read
after the step's update."""
from __future__ import annotations

from llumnix.core.batch import ModelOutput
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
