"""The real executor under the engine: preemption, KV export/import, determinism."""
from __future__ import annotations

import pytest

from llumnix.core.sampling_params import SamplingParams
from tests.model.helpers import drain, real_engine

PROMPT = list(range(10, 47))


def test_recompute_preemption_gives_the_same_greedy_tokens(tiny_loaded):
    def run(num_blocks):
        eng = real_engine(tiny_loaded, num_blocks=num_blocks, block_size=4)
        for i in range(3):
            eng.add_request(f"r{i}", [7 + i] + PROMPT[: 10 + 3 * i], SamplingParams(max_tokens=30),
                            arrival_time=float(i))
        return eng, drain(eng)

    roomy, expected = run(128)
    tight, got = run(26)
    assert roomy.scheduler.num_preemptions == 0 < tight.scheduler.num_preemptions
    assert got == expected
    assert tight.kv.num_free_blocks == 26


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=24),
                                    SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=3)])
def test_kv_export_import_into_a_second_engine_continues_identically(tiny_loaded, params):
    ref = real_engine(tiny_loaded)
    ref.add_request("x", PROMPT, params)
    expected = drain(ref)["x"]

    src = real_engine(tiny_loaded, instance_id="src")
    dst = real_engine(tiny_loaded, instance_id="dst")
    dst.add_request("other", [3] * 9, SamplingParams(max_tokens=40))  # shifts dst's block ids
    dst.step()
    src.add_request("x", PROMPT, params)
    produced = [t for _ in range(6) for o in src.step() for t in o.new_token_ids]
    # pre-copy the full blocks while x keeps decoding, then stop and copy the rest
    first = src.blocks_since("x", 0, full_only=True)
    got = dst.try_reserve("x", len(first))
    dst.executor.scatter_blocks(got, src.executor.gather_blocks(first))
    produced += [t for _ in range(5) for o in src.step() for t in o.new_token_ids]
    src.pause_request("x")
    rest = src.blocks_since("x", len(first))
    got = dst.try_reserve("x", len(rest))
    dst.executor.scatter_blocks(got, src.executor.gather_blocks(rest))
    dst.install_request(src.snapshot_request("x"))
    src.remove_request("x")
    out = drain(dst)
    assert produced + out["x"] == expected
    assert src.kv.num_free_blocks == src.kv.num_total_blocks
    assert dst.kv.num_free_blocks == dst.kv.num_total_blocks


def test_gather_scatter_round_trip_and_size_check(tiny_loaded):
    eng = real_engine(tiny_loaded, num_blocks=8)
    ex = eng.executor
    eng.add_request("x", PROMPT[:20], SamplingParams(max_tokens=1))
    eng.step()
    data = bytes(ex.gather_blocks([0, 1, 2]))
    assert len(data) == 3 * ex.bytes_per_block
    ex.scatter_blocks([5, 6, 7], data)
    assert bytes(ex.gather_blocks([5, 6, 7])) == data
    with pytest.raises(ValueError, match="bytes"):
        ex.scatter_blocks([5], data)
