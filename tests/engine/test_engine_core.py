from __future__ import annotations

import pytest

from llumnix.core.errors import InvalidRequestError, RequestTooLongError
from llumnix.core.request import Priority
from llumnix.core.sampling_params import SamplingParams
from tests.engine.helpers import make_engine, run_to_completion


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, **kw)


def test_requests_complete_with_exact_lengths_and_free_every_block():
    eng = make_engine()
    for i in range(5):
        eng.add_request(f"r{i}", list(range(1, 3 + 4 * i)), greedy(3 + i))
    out = run_to_completion(eng)
    assert {k: len(v) for k, v in out.items()} == {f"r{i}": 3 + i for i in range(5)}
    assert eng.kv.num_free_blocks == eng.kv.num_total_blocks


def test_step_is_either_prefill_or_decode():
    eng = make_engine()
    eng.add_request("a", [1, 2, 3], greedy(5))
    first = eng.schedule()
    assert first.is_prefill and [r.request_id for r in first.scheduled] == ["a"]
    eng.update(first, eng.executor.execute(first))
    eng.add_request("b", [4, 5], greedy(5))
    second = eng.schedule()  # a newcomer is prefilled before anyone decodes
    assert second.is_prefill and [r.request_id for r in second.scheduled] == ["b"]
    eng.update(second, eng.executor.execute(second))
    third = eng.schedule()
    assert not third.is_prefill and {r.request_id for r in third.scheduled} == {"a", "b"}
    assert all(len(r.token_ids) == 1 for r in third.scheduled)


def test_token_budget_and_batch_size_limit_admission():
    eng = make_engine(max_num_seqs=2, max_batched=10)
    eng.add_request("a", [1] * 6, greedy(2))
    eng.add_request("b", [1] * 6, greedy(2))
    eng.add_request("c", [1] * 2, greedy(2))
    batch = eng.schedule()
    assert [r.request_id for r in batch.scheduled] == ["a"]  # b would exceed 10 tokens; FCFS stops
    eng.update(batch, eng.executor.execute(batch))
    batch = eng.schedule()
    assert [r.request_id for r in batch.scheduled] == ["b"]  # then max_num_seqs=2 stops c


def test_a_lone_request_longer_than_the_token_budget_is_still_admitted():
    eng = make_engine(max_batched=8)
    eng.add_request("long", list(range(1, 21)), greedy(2))
    assert len(run_to_completion(eng)["long"]) == 2


def test_high_priority_is_admitted_first_fcfs_within_priority():
    eng = make_engine(max_num_seqs=1)
    eng.add_request("n1", [1, 2], greedy(1), arrival_time=0.0)
    eng.add_request("n2", [1, 2], greedy(1), arrival_time=0.1)
    eng.add_request("h1", [1, 2], greedy(1), priority=Priority.HIGH, arrival_time=0.2)
    eng.add_request("h2", [1, 2], greedy(1), priority=Priority.HIGH, arrival_time=0.3)
    order = []
    while eng.has_unfinished_requests():
        order += [o.request_id for o in eng.step() if o.is_finished]
    assert order == ["h1", "h2", "n1", "n2"]


def test_preemption_evicts_lowest_priority_most_recent_and_recompute_gives_same_tokens():
    # 12 blocks of 4 tokens: three requests of 8-token prompts fill 6 blocks and
    # then grow until someone must be evicted.
    def run(num_blocks):
        eng = make_engine(num_blocks=num_blocks, block_size=4)
        eng.add_request("old", list(range(1, 9)), greedy(20), arrival_time=0.0)
        eng.add_request("high", list(range(11, 19)), greedy(20), arrival_time=0.2,
                        priority=Priority.HIGH)
        eng.add_request("new", list(range(21, 29)), greedy(20), arrival_time=0.1)
        return eng, run_to_completion(eng)

    roomy, expected = run(64)
    assert roomy.scheduler.num_preemptions == 0
    tight, got = run(12)
    assert tight.scheduler.num_preemptions > 0
    assert got == expected
    assert tight.kv.num_free_blocks == 12


def test_preemption_victim_choice():
    eng = make_engine(num_blocks=10, block_size=4)
    eng.add_request("old", [1] * 8, greedy(30), arrival_time=0.0)
    eng.add_request("new", [2] * 8, greedy(30), arrival_time=0.1)
    eng.add_request("high", [3] * 4, greedy(30), arrival_time=0.2, priority=Priority.HIGH)
    eng.step()  # prefill all three: 2 + 2 + 1 blocks, 5 free
    preempted = []
    for _ in range(10):
        batch = eng.schedule()
        preempted += batch.preempted_request_ids
        if batch.scheduled:
            eng.update(batch, eng.executor.execute(batch))
        if preempted:
            break
    assert preempted[0] == "new"
    assert eng.get_request("new").num_preemptions == 1


def test_preemption_loss_is_recorded():
    eng = make_engine(num_blocks=6, block_size=4)
    eng.add_request("a", [1] * 8, greedy(12))
    eng.add_request("b", [2] * 8, greedy(12))
    metrics = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.metrics:
                metrics[o.request_id] = o.metrics
        eng.clock.advance_to(eng.clock.now() + 0.01)
    victim = metrics["b"]
    assert victim.num_preemptions >= 1 and victim.preemption_loss > 0
    assert metrics["a"].num_preemptions == 0 and metrics["a"].preemption_loss == 0


def test_admission_rejects_what_can_never_fit():
    eng = make_engine(num_blocks=8, block_size=4, max_model_len=64)
    with pytest.raises(RequestTooLongError, match="context"):
        eng.add_request("a", [1] * 64, greedy(1))
    with pytest.raises(RequestTooLongError, match="KV cache"):
        eng.add_request("b", [1] * 20, greedy(40))
    with pytest.raises(InvalidRequestError):
        eng.add_request("c", [], greedy(1))
    eng.add_request("d", [1] * 20, greedy(12))
    with pytest.raises(InvalidRequestError, match="in use"):
        eng.add_request("d", [1], greedy(1))
    assert not eng.requests.keys() - {"d"}


def test_stop_conditions():
    eng = make_engine(eos=None)
    eng.add_request("a", [1, 2, 3], greedy(50))
    probe = run_to_completion(eng)["a"]
    # The same request stops at the third token when it is EOS or a stop id.
    eng = make_engine(eos=probe[2])
    eng.add_request("a", [1, 2, 3], greedy(50))
    assert run_to_completion(eng)["a"] == probe[:3]
    eng = make_engine()
    eng.add_request("a", [1, 2, 3], greedy(50, stop_token_ids=(probe[1],)))
    assert run_to_completion(eng)["a"] == probe[:2]
    eng = make_engine(eos=probe[2])
    eng.add_request("a", [1, 2, 3], greedy(50, ignore_eos=True))
    assert len(run_to_completion(eng)["a"]) == 50


def test_min_tokens_holds_off_eos_and_stop_ids():
    """The fake model ignores the sampler's mask, so EOS may come early: it does not end
    the output before min_tokens tokens, and does after."""
    eng = make_engine(eos=None)
    eng.add_request("a", [1, 2, 3], greedy(50))
    probe = run_to_completion(eng)["a"]
    for n_min in (1, 3, 6):
        eng = make_engine(eos=probe[1])
        eng.add_request("a", [1, 2, 3], greedy(50, min_tokens=n_min))
        j = next((i for i in range(n_min - 1, 50) if probe[i] == probe[1]), 49)
        assert run_to_completion(eng)["a"] == probe[:j + 1]
        eng = make_engine()
        eng.add_request("a", [1, 2, 3], greedy(50, min_tokens=n_min, stop_token_ids=(probe[1],)))
        assert run_to_completion(eng)["a"] == probe[:j + 1]
    entries = []
    eng = make_engine(eos=7)
    eng.add_request("b", [1, 2, 3], greedy(4, min_tokens=2, stop_token_ids=(9,)))
    while eng.has_unfinished_requests():
        batch = eng.schedule()
        entries += [e.banned_token_ids for e in batch.scheduled]
        eng.update(batch, eng.executor.execute(batch))
    assert entries == [(7, 9), (7, 9), (), ()]


class DigitsDetokenizer:
    def decode(self, token_ids):
        return "".join(f"<{t}>" for t in token_ids)


def test_stop_strings_use_the_detokenizer():
    eng = make_engine()
    eng.add_request("a", [1, 2, 3], greedy(50))
    probe = run_to_completion(eng)["a"]
    eng = make_engine(detokenizer=DigitsDetokenizer())
    eng.add_request("a", [1, 2, 3], greedy(50, stop=(f"<{probe[4]}>",)))
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    assert [o.new_token_ids[0] for o in outs if o.request_id == "a"] == probe[:5]
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == f"<{probe[4]}>"


def test_min_tokens_holds_off_stop_strings_too():
    """A stop string that ends in the first min_tokens - 1 tokens' text does not count, even
    when it is still in the window the engine decodes once min_tokens is reached; one that a
    two-token string completes at the min_tokens-th token does."""
    eng = make_engine()
    eng.add_request("a", [1, 2, 3], greedy(50))
    probe = run_to_completion(eng)["a"]
    for stop, n_min in ((f"<{probe[0]}>", 3), (f"<{probe[1]}><{probe[2]}>", 3), (f"<{probe[0]}><{probe[1]}>", 3)):
        eng = make_engine(detokenizer=DigitsDetokenizer())
        eng.add_request("a", [1, 2, 3], greedy(50, stop=(stop,), min_tokens=n_min))
        text = "".join(f"<{t}>" for t in probe)
        floor = len("".join(f"<{t}>" for t in probe[:n_min - 1]))
        at = text.find(stop, floor - len(stop) + 1)
        end = 50 if at < 0 else next(i + 1 for i in range(50) if len("".join(f"<{t}>" for t in probe[:i + 1])) >= at + len(stop))
        assert run_to_completion(eng)["a"] == probe[:end], stop


def test_abort_frees_blocks_in_any_state():
    eng = make_engine(num_blocks=8, block_size=4, max_num_seqs=1)
    eng.add_request("run", [1] * 8, greedy(10))
    eng.add_request("wait", [1] * 4, greedy(10))
    eng.step()
    assert eng.abort_request("run") and eng.abort_request("wait")
    assert not eng.abort_request("nope")
    eng.check_invariants()
    assert eng.kv.num_free_blocks == 8 and not eng.has_unfinished_requests()


def test_status_snapshot():
    eng = make_engine(num_blocks=10, block_size=4, max_num_seqs=1)
    eng.add_request("a", [1] * 6, greedy(5), arrival_time=0.0)
    eng.add_request("b", [1] * 9, greedy(5), arrival_time=0.1, priority=Priority.HIGH)
    eng.add_request("c", [1] * 3, greedy(5), arrival_time=0.2)
    eng.step()
    st = eng.get_status()
    assert st.num_total_blocks == 10 and st.num_used_blocks == 3 and st.num_free_blocks == 7
    assert [r.request_id for r in st.running] == ["b"] and st.running[0].num_blocks == 3
    assert [r.request_id for r in st.waiting] == ["a", "c"]
    assert st.head_of_line_demand == 2  # "a": 6 tokens in blocks of 4
    assert st.batch_size == 1 and st.step_id == 1


@pytest.mark.parametrize("caching", [False, True])
def test_head_of_line_demand_counts_only_the_blocks_its_cached_prefix_does_not_cover(caching):
    """"b" shares 7 full blocks with running "a": with prefix caching it needs 2 free blocks
    to be admitted, not its 9, and freeness must see 2 (Algorithm 1's head-of-line demand)."""
    eng = make_engine(num_blocks=12, block_size=4, prefix_caching=caching)
    shared = list(range(100, 128))
    eng.add_request("a", [*shared, 1, 2, 3], greedy(8))
    eng.step()  # a's prefill: 8 blocks, 7 of them full and cached
    eng.add_request("c", list(range(300, 312)), greedy(8))
    eng.step()  # c's prefill: 3 blocks, 1 left
    eng.add_request("b", [*shared, *range(500, 508)], greedy(4))
    eng.step()  # b waits: it needs 2 free blocks with the cache, 9 without
    st = eng.get_status()
    assert [r.request_id for r in st.waiting] == ["b"]
    assert st.head_of_line_demand == (2 if caching else 9)
    if caching:  # while it waits, b is matched by its keys, hashed once; the match is as fresh
        b = eng.get_request("b")
        assert eng.scheduler._blocked_keys is not None and eng.scheduler._blocked_keys[0] is b
        eng.step()
        fresh = eng.kv.blocks_needed(b.num_tokens, eng.kv.match_prefix(b.prompt_token_ids))
        assert eng.get_status().head_of_line_demand == fresh == 2
    eng.abort_request("c")
    eng.step()  # 4 free blocks: with the cache b is admitted on a's blocks, without it still waits
    st = eng.get_status()
    if caching:
        assert st.head_of_line_demand == 0 and eng.get_request("b").num_cached_tokens == 28
        assert eng.scheduler._blocked_keys is None  # admitted: the keys are dropped
        # a and b share 7 blocks: their lengths count them twice, the pool once
        assert st.num_shared_block_holds == 7
        assert sum(r.num_blocks for r in st.running) - st.num_shared_block_holds == st.num_used_blocks
    else:
        assert [r.request_id for r in st.waiting] == ["b"] and st.head_of_line_demand == 9
    eng.check_invariants()


def test_head_of_line_demand_of_a_preempted_request_is_its_size_now():
    """b waited for memory once (3 blocks), ran, grew and was preempted: back at the head
    of the queue it needs 4 blocks, and the status must not report the 3 it once did."""
    eng = make_engine(num_blocks=6, block_size=4)
    eng.add_request("a", [1] * 16, greedy(1), arrival_time=0.0)
    eng.add_request("b", [2] * 12, greedy(8), arrival_time=0.1)
    eng.step()  # a's prefill takes 4 blocks and finishes; b waits for 3
    assert eng.get_status().head_of_line_demand == 3
    eng.step()  # b's prefill: 3 blocks, 13 tokens
    eng.add_request("c", [3] * 11, greedy(8), arrival_time=0.2, priority=Priority.HIGH)
    eng.step()  # c's prefill takes the last 3 blocks
    batch = eng.step()  # b needs a 4th block for its next token; c comes first
    assert eng.get_request("b").num_preemptions == 1, batch
    st = eng.get_status()
    assert [r.request_id for r in st.waiting] == ["b"]
    assert st.head_of_line_demand == 4
    eng.check_invariants()


def test_min_tokens_must_be_within_max_tokens():
    from llumnix.core.errors import InvalidRequestError

    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4
    for bad in ({"max_tokens": 4, "min_tokens": 5}, {"min_tokens": -1}, {"min_tokens": True}, {"min_tokens": 1.5}):
        with pytest.raises(InvalidRequestError, match="min_tokens"):
            SamplingParams(**bad)
