"""Export a request's KV and state from one engine, import it into another, continue."""
from __future__ import annotations

import pytest

from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine, run_to_completion


def _move(src, dst, rid, *, in_stages: bool) -> list[int]:
    """A miniature of the migration protocol over in-process engines.

    Returns the tokens the source produced while pre-copy stages ran."""
    sent = 0
    during = []
    if in_stages:
        for _ in range(3):  # pre-copy while the request keeps decoding
            new = src.blocks_since(rid, sent, full_only=True)
            got = dst.try_reserve(rid, len(new))
            assert got is not None
            dst.executor.scatter_blocks(got, src.executor.gather_blocks(new))
            sent += len(new)
            for _ in range(3):
                during += [t for o in src.step() if o.request_id == rid for t in o.new_token_ids]
    src.pause_request(rid)
    new = src.blocks_since(rid, sent)
    got = dst.try_reserve(rid, len(new))
    dst.executor.scatter_blocks(got, src.executor.gather_blocks(new))
    dst.install_request(src.snapshot_request(rid))
    src.remove_request(rid)
    src.check_invariants()
    dst.check_invariants()
    return during


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=40),
                                    SamplingParams(max_tokens=40, temperature=0.8, seed=7)])
@pytest.mark.parametrize("in_stages", [False, True])
def test_migrated_request_continues_identically(params, in_stages):
    ref = make_engine()
    ref.add_request("x", list(range(1, 23)), params)
    expected = run_to_completion(ref)["x"]

    src, dst = make_engine(instance_id="src"), make_engine(instance_id="dst")
    dst.add_request("other", [5] * 9, SamplingParams(max_tokens=30))  # dst's ids differ
    dst.step()
    src.add_request("x", list(range(1, 23)), params)
    produced = []
    for _ in range(5):
        produced += [t for o in src.step() for t in o.new_token_ids]
    during = _move(src, dst, "x", in_stages=in_stages)
    assert len(during) == (9 if in_stages else 0)
    produced += during
    assert dst.get_request("x").output_token_ids == produced
    rest = run_to_completion(dst)["x"]
    assert produced + rest == expected
    assert src.kv.num_free_blocks == src.kv.num_total_blocks
    assert dst.kv.num_free_blocks == dst.kv.num_total_blocks


def test_reservation_respects_watermark_and_release_is_exact():
    dst = make_engine(num_blocks=20, watermark=0.25)  # 5 watermark blocks
    assert dst.try_reserve("m", 16) is None
    assert dst.try_reserve("m", 10) is not None
    assert dst.get_status().num_reserved_blocks == 10
    assert dst.release_reservation("m") == 10
    dst.check_invariants()
    assert dst.kv.num_free_blocks == 20


def test_queued_request_migrates_as_metadata():
    src, dst = make_engine(max_num_seqs=1), make_engine()
    src.add_request("busy", [1] * 5, SamplingParams(max_tokens=5))
    src.add_request("q", [2] * 5, SamplingParams(max_tokens=5))
    src.step()
    snap = src.snapshot_request("q")
    assert snap.num_computed_tokens == 0
    dst.install_request(snap)
    src.remove_request("q")
    assert len(run_to_completion(dst)["q"]) == 5
    run_to_completion(src)
    assert src.kv.num_free_blocks == src.kv.num_total_blocks


def test_paused_request_is_not_scheduled_and_resumes():
    eng = make_engine()
    eng.add_request("a", [1] * 5, SamplingParams(max_tokens=10))
    eng.add_request("b", [1] * 5, SamplingParams(max_tokens=10))
    eng.step()
    eng.pause_request("a")
    batch = eng.schedule()
    assert [r.request_id for r in batch.scheduled] == ["b"]
    eng.update(batch, eng.executor.execute(batch))
    assert eng.get_status().running[-1].is_migrating
    eng.resume_request("a")
    out = run_to_completion(eng)
    assert len(out["a"]) == 9 and len(out["b"]) == 8
