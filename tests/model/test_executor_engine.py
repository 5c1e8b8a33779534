"""The real executor under the engine: preemption, KV export/import, determinism."""
from __future__ import annotations

import pytest

from llumnix.core.sampling_params import SamplingParams
from tests.model.helpers import drain, real_engine

PROMPT = list(range(10, 47))


PENALISED = SamplingParams(max_tokens=30, temperature=0.8, seed=5, frequency_penalty=0.6, presence_penalty=0.4,
                           repetition_penalty=1.3, logit_bias=((3, 2.0), (11, -5.0)))


def hand_migrate(src, dst, rid: str, between=None) -> int:
    """Migration by its engine operations: pre-copy the request's computed full blocks,
    run ``between`` (the source keeps stepping), then pause it, copy the rest, install it
    on ``dst`` and drop it from ``src``. Returns the blocks pre-copied."""
    first = src.blocks_since(rid, 0, full_only=True)
    got = dst.try_reserve(rid, len(first))
    dst.executor.scatter_blocks(got, src.executor.gather_blocks(first))
    if between is not None:
        between()
    src.pause_request(rid)
    rest = src.blocks_since(rid, len(first))
    got = dst.try_reserve(rid, len(rest))
    dst.executor.scatter_blocks(got, src.executor.gather_blocks(rest))
    dst.install_request(src.snapshot_request(rid))
    src.remove_request(rid)
    src.check_invariants()
    return len(first)


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=30), PENALISED])
def test_recompute_preemption_gives_the_same_tokens(tiny_loaded, params):
    """A recomputed request resumes its token stream exactly, greedy or sampled with
    penalties (which read the output so far)."""
    def run(num_blocks):
        eng = real_engine(tiny_loaded, num_blocks=num_blocks, block_size=4)
        for i in range(3):
            eng.add_request(f"r{i}", [7 + i] + PROMPT[: 10 + 3 * i], params, arrival_time=float(i))
        return eng, drain(eng)

    roomy, expected = run(128)
    tight, got = run(26)
    assert roomy.scheduler.num_preemptions == 0 < tight.scheduler.num_preemptions
    assert got == expected
    assert tight.kv.num_free_blocks == 26


@pytest.mark.parametrize("num_blocks", [128, 20])
def test_prefix_caching_gives_the_same_tokens_with_the_real_model(tiny_loaded, num_blocks):
    """Requests that share a 24-token prefix, arriving while earlier ones run or after they
    finished: with the cache their prefix's KV is read, not recomputed, and every output
    is what the engine without a cache produces (20 blocks: with preemptions too)."""
    shared = PROMPT[:24]
    prompts = [shared + [3, 4, 5], shared + [6], shared + PROMPT[24:30], PROMPT[5:20], shared + [3, 4, 5, 7]]

    def run(caching):
        eng = real_engine(tiny_loaded, num_blocks=num_blocks, block_size=4, prefix_caching=caching)
        out: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=20, ignore_eos=True))
            for _ in range(3 + 10 * (i == 2)):  # r3 and r4 come after the first three finished
                for o in eng.step():
                    out.setdefault(o.request_id, []).extend(o.new_token_ids)
                eng.check_invariants()
        for rid, toks in drain(eng).items():
            out.setdefault(rid, []).extend(toks)
        assert eng.kv.num_free_blocks == num_blocks
        return eng, out

    _, expected = run(False)
    eng, got = run(True)
    assert got == expected
    assert eng.kv.prefix is not None and eng.kv.prefix.num_hit_tokens >= 3 * 24  # r1, r2, r4
    assert (eng.scheduler.num_preemptions > 0) == (num_blocks == 20)


def test_penalties_change_the_output_as_asked(tiny_loaded):
    """Frequency penalty thins out repeats; a large bias forces its token."""
    def tokens(params):
        eng = real_engine(tiny_loaded)
        eng.add_request("r", PROMPT, params)
        return drain(eng)["r"]

    plain = tokens(SamplingParams(max_tokens=40, ignore_eos=True))
    thinned = tokens(SamplingParams(max_tokens=40, ignore_eos=True, frequency_penalty=2.0))
    assert len(set(thinned)) > len(set(plain)), (plain, thinned)
    assert tokens(SamplingParams(max_tokens=5, logit_bias=((77, 100.0),))) == [77] * 5


def test_min_tokens_masks_eos_and_stop_ids_until_the_output_is_long_enough(tiny_loaded):
    """Greedy output whose first token is made a stop id: without min_tokens it ends there;
    with min_tokens 3 the first three tokens cannot be it, and it may end the output after."""
    def tokens(params):
        eng = real_engine(tiny_loaded)
        eng.add_request("r", PROMPT, params)
        return drain(eng)["r"]

    probe = tokens(SamplingParams(max_tokens=12, ignore_eos=True))
    stop = probe[0]
    assert tokens(SamplingParams(max_tokens=12, stop_token_ids=(stop,))) == [stop]
    out = tokens(SamplingParams(max_tokens=12, min_tokens=3, stop_token_ids=(stop,)))
    assert stop not in out[:3] and 3 <= len(out) <= 12
    assert stop not in out[3:-1]  # it ends the output where it first comes after the third
    assert out[-1] == stop or len(out) == 12


@pytest.mark.parametrize("params,caching", [
    (SamplingParams(max_tokens=24), False),
    (SamplingParams(max_tokens=24, temperature=0.9, top_p=0.9, seed=3), False),
    (PENALISED, False),
    (SamplingParams(max_tokens=24), True),
])
def test_kv_export_import_into_a_second_engine_continues_identically(tiny_loaded, params, caching):
    """With prefix caching the migrating request's table starts with blocks it shares
    with a request that stays on the source."""
    ref = real_engine(tiny_loaded)
    ref.add_request("x", PROMPT, params)
    expected = drain(ref)["x"]

    src = real_engine(tiny_loaded, instance_id="src", prefix_caching=caching)
    dst = real_engine(tiny_loaded, instance_id="dst", prefix_caching=caching)
    dst.add_request("other", [3] * 9, SamplingParams(max_tokens=40))  # shifts dst's block ids
    dst.step()
    if caching:
        src.add_request("stays", PROMPT + [1, 2], SamplingParams(max_tokens=30))
        src.step()
    src.add_request("x", PROMPT, params)
    produced = [t for _ in range(6) for o in src.step() for t in o.new_token_ids if o.request_id == "x"]
    if caching:
        shared = set(src.kv.block_table("x")) & set(src.kv.block_table("stays"))
        assert len(shared) == len(PROMPT) // 4 and src.requests["x"].num_cached_tokens == 36
    # pre-copy the full blocks while x keeps decoding, then stop and copy the rest
    hand_migrate(src, dst, "x", between=lambda: produced.extend(
        t for _ in range(5) for o in src.step() for t in o.new_token_ids if o.request_id == "x"))
    out = drain(dst)
    assert produced + out["x"] == expected
    drain(src)
    assert src.kv.num_free_blocks == src.kv.num_total_blocks
    assert dst.kv.num_free_blocks == dst.kv.num_total_blocks


@pytest.mark.parametrize("dst_holds", [True, False])
def test_a_migration_adopts_the_destinations_cached_prefix_and_continues_identically(tiny_loaded, dst_holds):
    """The destination already caches the first 20 tokens of the migrating request (held
    by a running request there, or only evictable): those 5 blocks are adopted by their
    keys and never sent; the request continues exactly as without migration."""
    from llumnix.kv.prefix_cache import sequence_keys

    params = SamplingParams(max_tokens=24)
    ref = real_engine(tiny_loaded)
    ref.add_request("x", PROMPT, params)
    expected = drain(ref)["x"]

    src = real_engine(tiny_loaded, instance_id="src", prefix_caching=True)
    dst = real_engine(tiny_loaded, instance_id="dst", prefix_caching=True)
    dst.add_request("other", PROMPT[:20] + [3, 4, 5], SamplingParams(max_tokens=40 if dst_holds else 2))
    for _ in range(3):
        dst.step()
    assert dst.has_unfinished_requests() == dst_holds
    src.add_request("x", PROMPT, params)
    produced = [t for _ in range(6) for o in src.step() for t in o.new_token_ids if o.request_id == "x"]
    req = src.requests["x"]
    full = src.blocks_since("x", 0, full_only=True)
    got = dst.try_reserve_with_cache("x", sequence_keys(req.prompt_token_ids, req.output_token_ids, len(full), 4))
    assert got is not None
    n, fresh = got
    assert n == 5 and len(fresh) == len(full) - 5 and dst.kv.num_shared_block_holds == (5 if dst_holds else 0)
    dst.executor.scatter_blocks(fresh, src.executor.gather_blocks(full[n:]))
    produced += [t for _ in range(5) for o in src.step() for t in o.new_token_ids if o.request_id == "x"]
    src.pause_request("x")
    rest = src.blocks_since("x", len(full))
    dst.executor.scatter_blocks(dst.try_reserve("x", len(rest)), src.executor.gather_blocks(rest))
    dst.install_request(src.snapshot_request("x"))
    src.remove_request("x")
    dst.check_invariants()
    out = drain(dst)
    assert produced + out["x"] == expected
    assert dst.kv.num_free_blocks == dst.kv.num_total_blocks
    assert src.kv.num_free_blocks == src.kv.num_total_blocks


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


def test_prompt_logprobs_match_transformers_and_come_once(tiny_llama_dir, tiny_loaded, monkeypatch):
    """Each prompt token after the first gets its logprob under the tokens before it (and
    the top alternatives), in a batch beside requests that ask for nothing, over several
    logits slices, and only on the first output: a recompute after preemption does not
    report them again."""
    import torch

    import llumnix.model.executor as executor_mod

    monkeypatch.setattr(executor_mod, "PROMPT_LOGITS_ROWS", 7)  # several slices per prompt
    _, hf = tiny_llama_dir
    prompts = {"a": [7] + PROMPT[:20], "b": [9] + PROMPT[5:30], "c": [11] + PROMPT[:12]}
    eng = real_engine(tiny_loaded, num_blocks=26, block_size=4)  # tight: forces preemptions
    eng.add_request("a", prompts["a"], SamplingParams(max_tokens=25, prompt_logprobs=3), arrival_time=0.0)
    eng.add_request("b", prompts["b"], SamplingParams(max_tokens=25), arrival_time=1.0)
    eng.add_request("c", prompts["c"], SamplingParams(max_tokens=25, prompt_logprobs=0), arrival_time=2.0)
    got: dict[str, list] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.prompt_logprobs is not None:
                assert o.request_id not in got and o.num_output_tokens == 1  # once, with the first token
                got[o.request_id] = o.prompt_logprobs
        eng.check_invariants()
    assert eng.scheduler.num_preemptions > 0
    assert set(got) == {"a", "c"}
    for rid, k in (("a", 3), ("c", 0)):
        ids = prompts[rid]
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        assert [t for t, _, _ in got[rid]] == ids[1:]
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        torch.testing.assert_close(torch.tensor([lp for _, lp, _ in got[rid]]), want, atol=1e-4, rtol=1e-4)
        if k:
            for pos, (_, _, top) in enumerate(got[rid]):
                values, top_ids = ref[pos].topk(k)
                assert [t for t, _ in top] == top_ids.tolist()
                torch.testing.assert_close(torch.tensor([v for _, v in top]), values, atol=1e-4, rtol=1e-4)
        else:
            assert all(top is None for _, _, top in got[rid])


def test_llm_generate_returns_the_logprobs_it_was_asked_for(tiny_llama_dir):
    """The offline API carries sampled and prompt logprobs through; the prompt's agree with
    what generating the same tokens reported (the cache path against the prefill path)."""
    from llumnix.llm import LLM

    llm = LLM(str(tiny_llama_dir[0]), num_blocks=64, block_size=4)
    prompt = [5, 17, 42, 99, 3]
    (gen,) = llm.generate([prompt], SamplingParams(max_tokens=6, logprobs=2))
    assert gen.logprobs is not None and gen.top_logprobs is not None
    assert len(gen.logprobs) == len(gen.top_logprobs) == 6 and gen.prompt_logprobs is None
    assert all(top[0][0] == t for top, t in zip(gen.top_logprobs, gen.token_ids, strict=True))  # greedy
    (scored,) = llm.generate([prompt + gen.token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0))
    assert scored.logprobs is None and scored.prompt_logprobs is not None
    tail = scored.prompt_logprobs[len(prompt) - 1:]
    assert [t for t, _, _ in tail] == gen.token_ids
    assert all(abs(lp - want) < 1e-4 for (_, lp, _), want in zip(tail, gen.logprobs, strict=True))
    (plain,) = llm.generate([prompt], SamplingParams(max_tokens=2))
    assert plain.logprobs is None and plain.top_logprobs is None and plain.prompt_logprobs is None


@pytest.mark.parametrize("caching", [False, True])
def test_chunked_prefill_gives_the_same_tokens_and_logprobs_with_the_real_model(tiny_loaded, caching):
    """Long prompts prefilled in 8-token chunks beside running decodes (steps that mix
    one-token and chunk attention groups) produce what whole prefills produce, greedy and
    sampled, with the same logprobs."""
    prompts = [PROMPT[:5], PROMPT, PROMPT[3:30], [9, 8, 7], PROMPT[:20] + [5, 6]]
    params = [SamplingParams(max_tokens=12, logprobs=2), SamplingParams(max_tokens=8, temperature=0.9, seed=3),
              SamplingParams(max_tokens=10, logprobs=1), PENALISED, SamplingParams(max_tokens=6)]

    def run(chunk):
        eng = real_engine(tiny_loaded, num_blocks=128, block_size=4, max_num_seqs=8, prefix_caching=caching,
                          chunk=chunk)
        toks: dict[str, list[int]] = {}
        lps: dict[str, list[float]] = {}
        mixed = 0
        i = 0
        while i < len(prompts) or eng.has_unfinished_requests():
            if i < len(prompts):  # a new request every second step
                eng.add_request(f"r{i}", prompts[i], params[i])
                i += 1
            for _ in range(2):
                batch = eng.schedule()
                if batch.is_empty:
                    continue
                mixed += batch.is_mixed
                for o in eng.update(batch, eng.executor.execute(batch)):
                    toks.setdefault(o.request_id, []).extend(o.new_token_ids)
                    lps.setdefault(o.request_id, []).extend(o.new_logprobs or [])
                eng.check_invariants()
        assert eng.kv.num_free_blocks == 128
        return toks, lps, mixed

    expected, expected_lps, _ = run(None)
    got, got_lps, mixed = run(8)
    assert got == expected
    assert mixed >= 3
    assert len(got_lps["r0"]) == 12 and len(got_lps["r2"]) == 10  # the two that ask for logprobs
    for rid in ("r0", "r2"):
        assert got_lps[rid] == pytest.approx(expected_lps[rid], abs=1e-4)


def test_a_request_migrated_mid_prefill_continues_identically(tiny_loaded):
    """Chunked prefill: a request moved after two of its chunks (its computed blocks
    pre-copied, the rest with the last stage) finishes its prefill on the destination."""
    ref = real_engine(tiny_loaded)
    ref.add_request("x", PROMPT, SamplingParams(max_tokens=12))
    expected = drain(ref)["x"]

    src = real_engine(tiny_loaded, instance_id="src", chunk=16)
    dst = real_engine(tiny_loaded, instance_id="dst", chunk=16)
    dst.add_request("other", [3] * 9, SamplingParams(max_tokens=40))  # shifts dst's block ids
    dst.step()
    src.add_request("d", [4, 5, 6], SamplingParams(max_tokens=30))
    src.step()
    src.add_request("x", PROMPT, SamplingParams(max_tokens=12))  # 37 tokens: 15 + 15 + 7 beside "d"
    assert all(o.request_id != "x" for _ in range(2) for o in src.step())
    assert src.requests["x"].num_computed_tokens == 30
    assert hand_migrate(src, dst, "x") == 7  # the computed full blocks only, pre-copied
    dst.check_invariants()
    assert drain(dst)["x"] == expected
    drain(src)
    assert src.kv.num_free_blocks == src.kv.num_total_blocks
    assert dst.kv.num_free_blocks == dst.kv.num_total_blocks
