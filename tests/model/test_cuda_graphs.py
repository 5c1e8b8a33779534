"""Decode steps through the graphs' buckets. Here, on the CPU, the padded steps run
eagerly (what a graph records); tests/model/test_gpu.py replays them on CUDA."""
from __future__ import annotations

import pytest
import torch

from llumnix.core.sampling_params import SamplingParams
from llumnix.model import ModelExecutor
from llumnix.model.cuda_graphs import GraphShapes, powers_up_to
from tests.model.helpers import drain, first_decode_logits, real_engine

PROMPTS = [[5, 6, 7], list(range(30, 70)), [9] * 17, list(range(100, 111)), [42] * 33]
# different lengths, so the batch shrinks from 5 to 1 and contexts cross block buckets
MAX_TOKENS = [40, 9, 25, 3, 17]


def _run(loaded, graphs: bool, sampled: bool = False) -> tuple[dict[str, list[int]], object]:
    eng = real_engine(loaded, num_blocks=96, graphs=graphs)
    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        params = SamplingParams(max_tokens=n, temperature=0.8, top_k=20, seed=i) if sampled \
            else SamplingParams(max_tokens=n)
        eng.add_request(f"r{i}", p, params)
    return drain(eng), eng


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_padded_decode_steps_give_the_eager_tokens(tiny_loaded, sampled):
    eager, _ = _run(tiny_loaded, graphs=False, sampled=sampled)
    padded, eng = _run(tiny_loaded, graphs=True, sampled=sampled)
    assert padded == eager
    graphs = eng.executor.graphs
    assert graphs is not None
    # every step after the prefills is a decode step through a bucket
    assert graphs.num_steps >= max(MAX_TOKENS) - 1


def test_padded_logits_match_eager(tiny_loaded):
    """Same logits (to rounding) for a batch padded from 3 rows to 4 and from 7 blocks
    of context to 8."""
    torch.testing.assert_close(first_decode_logits(tiny_loaded, graphs=True),
                               first_decode_logits(tiny_loaded, graphs=False), atol=1e-5, rtol=1e-5)


def test_padding_rows_touch_only_the_scratch_block(tiny_loaded):
    eng = real_engine(tiny_loaded, num_blocks=96, graphs=True)
    ex = eng.executor
    storage = ex.graphs.storage
    storage.fill_(7.0)  # a finite sentinel in every slot
    used: set[int] = set()
    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=n))
    while eng.has_unfinished_requests():
        used.update(b for r in eng.scheduler.running for b in eng.block_table(r.request_id))
        eng.step()
        used.update(b for r in eng.scheduler.running for b in eng.block_table(r.request_id))
        eng.check_invariants()
    untouched = [b for b in range(ex.num_blocks) if b not in used]
    assert untouched and bool((storage[:, :, untouched] == 7.0).all())
    assert not bool((storage[:, :, ex.graphs.scratch] == 7.0).all())  # padding rows wrote there
    assert ex.kv_cache.shape[2] == ex.num_blocks == ex.graphs.scratch  # the pool does not see it


def test_steps_without_a_bucket_run_eagerly(tiny_loaded):
    """A step with a prefill, or more context than max_gather_bytes allows, takes the eager path."""
    per_token = 2 * tiny_loaded.config.kv_size * 4  # K and V of one layer, float32
    shapes = GraphShapes(max_batch=4, max_len=512, max_gather_bytes=64 * per_token)
    ex = ModelExecutor(tiny_loaded.model, 96, 4, graphs=shapes, record_graphs=False)
    assert ex.graphs is not None
    assert ex.graphs.batches == [1, 2, 4] and ex.graphs.block_buckets[-1] == 128
    assert max(b * n * 4 for b, n in ex.graphs._graphs) <= 64
    eng = real_engine(tiny_loaded, num_blocks=96, graphs=False)
    eng.executor = ex
    eng.add_request("long", list(range(10, 90)), SamplingParams(max_tokens=3))
    drain(eng)
    assert ex.graphs.num_steps == 0


def test_record_needs_cuda(tiny_loaded):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        ModelExecutor(tiny_loaded.model, 8, 4, graphs=GraphShapes(max_batch=2, max_len=64))


def test_powers_up_to():
    assert powers_up_to(1) == [1]
    assert powers_up_to(8) == [1, 2, 4, 8]
    assert powers_up_to(48) == [1, 2, 4, 8, 16, 32, 48]
