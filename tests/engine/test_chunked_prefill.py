"""Chunked prefill: decodes first, then prefills within the step's token budget.

The fake executor samples a hash of every slot a request reads, and fails on an unwritten
one, so equal outputs mean every chunk read exactly the KV a whole prefill would have."""
from __future__ import annotations

import pytest

from llumnix.core.config import SchedulerConfig
from llumnix.core.errors import InvalidRequestError
from llumnix.core.request import Priority, RequestStatus
from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine, run_to_completion


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def add_mix(eng, prompt_lens=(5, 70, 9, 33, 120, 2), max_tokens=(12, 6, 20, 9, 4, 15)) -> None:
    for i, (n, m) in enumerate(zip(prompt_lens, max_tokens, strict=True)):
        eng.add_request(f"r{i}", [(7 * i + k) % 50 + 1 for k in range(n)], greedy(m), arrival_time=float(i))


@pytest.mark.parametrize("num_blocks", [200, 34])
@pytest.mark.parametrize("caching", [False, True])
def test_chunked_prefill_gives_the_same_tokens_and_frees_every_block(num_blocks, caching):
    """34 blocks: preemptions too (recomputed in chunks)."""
    def run(chunked: bool):
        eng = make_engine(num_blocks=num_blocks, block_size=4, max_num_seqs=8, max_batched=16 if chunked else 256,
                          chunked=chunked, prefix_caching=caching)
        add_mix(eng)
        out = run_to_completion(eng)
        assert eng.kv.num_free_blocks == num_blocks
        return eng, out

    _, expected = run(False)
    eng, got = run(True)
    assert got == expected
    if num_blocks == 40:
        assert eng.scheduler.num_preemptions > 0


def test_a_step_serves_every_decode_first_then_prefills_within_the_budget():
    eng = make_engine(num_blocks=200, block_size=4, max_num_seqs=8, max_batched=16, chunked=True)
    eng.add_request("short", [1, 2, 3], greedy(40))
    eng.step()  # prefills "short" (3 tokens): it decodes from now on
    eng.add_request("long", list(range(1, 51)), greedy(3))  # 50 tokens: 4 chunks beside the decode
    eng.add_request("next", [9] * 5, greedy(3))
    sizes = []
    while eng.requests["long"].first_token_time is None:
        batch = eng.schedule()
        assert batch.num_batched_tokens <= 16
        assert batch.scheduled[0].request_id == "short" and len(batch.scheduled[0].token_ids) == 1
        assert batch.num_decodes >= 1 and batch.is_mixed
        sizes.append([(e.request_id, len(e.token_ids), e.sample) for e in batch.scheduled[1:]])
        eng.update(batch, eng.executor.execute(batch))
        eng.check_invariants()
    # "long" takes 15 tokens a step (16 less the decode); its last chunk shares the step with
    # "next", which is admitted behind it and prefilled whole
    assert sizes == [[("long", 15, False)], [("long", 15, False)], [("long", 15, False)],
                     [("long", 5, True), ("next", 5, True)]]
    long = eng.requests["long"]
    assert long.num_output_tokens == 1 and long.status == RequestStatus.RUNNING
    run_to_completion(eng)
    assert eng.kv.num_free_blocks == 200


def test_a_prefill_in_progress_holds_its_blocks_and_reports_no_output():
    eng = make_engine(num_blocks=100, block_size=4, max_num_seqs=4, max_batched=8, chunked=True)
    eng.add_request("a", list(range(1, 31)), greedy(2))
    outs = eng.step()
    req = eng.requests["a"]
    assert outs == [] and req.status == RequestStatus.RUNNING
    assert req.num_computed_tokens == 8 and eng.kv.num_blocks_of("a") == 8  # the whole prompt's blocks
    assert eng.get_status().running[0].num_tokens == 30
    eng.step()
    assert req.num_computed_tokens == 16


def test_prefix_cache_keys_the_blocks_a_chunk_computed():
    """A request that shares a prefix with one still prefilling reads the blocks its first
    chunks computed."""
    eng = make_engine(num_blocks=100, block_size=4, max_num_seqs=4, max_batched=8, chunked=True,
                      prefix_caching=True)
    shared = list(range(1, 25))
    eng.add_request("a", shared + [40, 41, 42], greedy(2))
    eng.step()
    eng.step()  # 16 tokens of "a" computed: 4 full blocks keyed
    eng.add_request("b", shared[:16] + [50, 51], greedy(2))
    eng.step()  # "a" takes the whole budget
    eng.step()  # "a" finishes its prompt (3 tokens), "b" is admitted on 16 cached tokens
    assert eng.requests["b"].num_cached_tokens == 16
    run_to_completion(eng)
    assert eng.kv.num_free_blocks == 100


def test_preempt_or_abort_mid_prefill_frees_the_blocks_and_recomputes_the_same():
    def run(action: str | None):
        eng = make_engine(num_blocks=60, block_size=4, max_num_seqs=4, max_batched=8, chunked=True)
        eng.add_request("a", list(range(1, 41)), greedy(5))
        eng.add_request("b", [3, 4, 5], greedy(5))
        eng.step()
        eng.step()
        if action == "preempt":
            eng.scheduler.preempt(eng.requests["a"])
            assert eng.kv.num_blocks_of("a") == 0 and eng.requests["a"].num_computed_tokens == 0
        elif action == "abort":
            assert eng.abort_request("a")
        eng.check_invariants()
        out = run_to_completion(eng)
        assert eng.kv.num_free_blocks == 60
        return out

    expected = run(None)
    assert run("preempt") == expected
    assert run("abort") == {"b": expected["b"]}


def test_a_request_that_asks_for_prompt_logprobs_is_prefilled_whole():
    eng = make_engine(num_blocks=100, block_size=4, max_num_seqs=4, max_batched=8, chunked=True)
    eng.add_request("d", [1, 2], greedy(20))
    eng.step()
    eng.add_request("p", list(range(1, 21)), greedy(2, prompt_logprobs=0))
    batch = eng.schedule()
    assert [(e.request_id, len(e.token_ids)) for e in batch.scheduled] == [("d", 1), ("p", 20)]


def test_chunked_prefill_needs_a_budget_for_every_decode():
    with pytest.raises(InvalidRequestError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32, chunked_prefill=True)
    SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32)  # unchunked: a lone request may exceed it


def test_a_high_priority_arrival_does_not_wait_out_a_normal_prompts_chunks():
    """Priority holds across prefills under way and queued ones: a high-priority request
    that arrives while a long normal prompt is being chunked is prefilled at the next step,
    ahead of the rest of that prompt; a normal arrival waits behind it (FCFS)."""
    eng = make_engine(num_blocks=200, block_size=4, max_num_seqs=4, max_batched=8, chunked=True)
    eng.add_request("long", list(range(1, 41)), greedy(2))
    eng.step()  # 8 of its 40 tokens
    eng.add_request("later", [5] * 6, greedy(2), arrival_time=1.0)
    eng.add_request("vip", [7] * 6, greedy(2), priority=Priority.HIGH, arrival_time=2.0)
    batch = eng.schedule()
    assert [(e.request_id, len(e.token_ids)) for e in batch.scheduled] == [("vip", 6), ("long", 2)]
    eng.update(batch, eng.executor.execute(batch))
    batch = eng.schedule()  # "vip" decodes; "long" goes on before the normal arrival
    assert [(e.request_id, len(e.token_ids)) for e in batch.scheduled] == [("vip", 1), ("long", 7)]
    eng.update(batch, eng.executor.execute(batch))
    run_to_completion(eng)
    assert eng.kv.num_free_blocks == 200
