"""Our paged forward against transformers and against a plain full-attention forward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llumnix.core.sampling_params import SamplingParams
from tests.model.helpers import drain, real_engine

PROMPTS = [[5, 17, 200, 33, 9], list(range(40, 77)), [250] * 3 + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def reference_forward(model, ids: list[int]) -> torch.Tensor:
    """Full causal attention, no cache, no paging: logits of every position."""
    cfg = model.config
    h = model.lm_head.T[torch.tensor(ids)]  # tied embeddings
    n = len(ids)
    cos, sin = model.cos[:n].unsqueeze(1), model.sin[:n].unsqueeze(1)

    def rot(x):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    for lw in model.layers:
        x = F.rms_norm(h, (cfg.hidden_size,), lw.attn_norm, cfg.rms_norm_eps)
        q, k, v = (x @ lw.wqkv).split([cfg.q_size, cfg.kv_size, cfg.kv_size], -1)
        q = rot(q.view(n, cfg.num_heads, -1))
        k = rot(k.view(n, cfg.num_kv_heads, -1)).repeat_interleave(cfg.num_heads // cfg.num_kv_heads, 1)
        v = v.view(n, cfg.num_kv_heads, -1).repeat_interleave(cfg.num_heads // cfg.num_kv_heads, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / cfg.head_dim ** 0.5
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
        h = h + att @ lw.wo
        x = F.rms_norm(h, (cfg.hidden_size,), lw.ffn_norm, cfg.rms_norm_eps)
        g, u = (x @ lw.w_gate_up).chunk(2, -1)
        h = h + (F.silu(g) * u) @ lw.w_down
    return F.rms_norm(h, (cfg.hidden_size,), model.norm, cfg.rms_norm_eps) @ model.lm_head


def test_loaded_config_matches_the_directory(tiny_loaded):
    c = tiny_loaded.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (2, 4, 2, 16, 257)
    assert tiny_loaded.model.is_tied and tiny_loaded.model.embed is None  # one tensor


def test_logits_match_transformers_and_the_reference(tiny_llama_dir, tiny_loaded):
    _, hf = tiny_llama_dir
    for ids in PROMPTS:
        with torch.inference_mode():
            theirs = hf(torch.tensor([ids])).logits[0]
            ref = reference_forward(tiny_loaded.model, ids)
        torch.testing.assert_close(ref, theirs, atol=1e-4, rtol=1e-4)
        # ours: prefill all but the last token, then decode the last one
        eng = real_engine(tiny_loaded)
        eng.add_request("r", ids[:-1], SamplingParams(max_tokens=1))
        batch = eng.schedule()
        logits_prefill = eng.executor.model.forward(eng.executor._build(batch), eng.executor.kv_cache)
        torch.testing.assert_close(logits_prefill[0], theirs[-2], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.5])
def test_greedy_tokens_match_transformers_generate(tiny_llama_dir, tiny_loaded, repetition_penalty):
    """Plain greedy, and with transformers' repetition penalty (prompt and output tokens)."""
    _, hf = tiny_llama_dir
    for ids in PROMPTS:
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0, repetition_penalty=repetition_penalty)
        eng = real_engine(tiny_loaded)
        eng.add_request("r", ids, SamplingParams(max_tokens=20, ignore_eos=True,
                                                 repetition_penalty=repetition_penalty))
        assert drain(eng)["r"] == out[0, len(ids):].tolist()


def test_batched_ragged_decode_equals_unbatched(tiny_loaded):
    alone = {}
    for i, ids in enumerate(PROMPTS):
        eng = real_engine(tiny_loaded)
        eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=15))
        alone.update(drain(eng))
    eng = real_engine(tiny_loaded)
    for i, ids in enumerate(PROMPTS):
        eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=15))
    assert drain(eng) == alone


def test_mixed_prefill_and_decode_in_one_batch(tiny_loaded):
    """The forward handles any mix, though the scheduler issues pure batches today."""
    from llumnix.core.batch import ScheduledRequest, SchedulerOutput

    eng = real_engine(tiny_loaded)
    eng.add_request("a", PROMPTS[0], SamplingParams(max_tokens=5))
    eng.step()  # a is now decoding
    a = eng.get_request("a")
    eng.kv.allocate("b", len(PROMPTS[1]))
    eng.kv.append_slot("a", a.num_tokens)
    params = SamplingParams(max_tokens=1)
    batch = SchedulerOutput([
        ScheduledRequest("a", a.new_token_ids(), a.num_computed_tokens, eng.kv.block_table("a"), params, 0, 1),
        ScheduledRequest("b", PROMPTS[1], 0, eng.kv.block_table("b"), params, 0, 0),
    ], is_prefill=False)
    mixed = eng.executor.execute(batch).sampled_token_ids
    solo = real_engine(tiny_loaded)
    solo.add_request("b", PROMPTS[1], params)
    assert mixed[1] == drain(solo)["b"][0]
    ref = real_engine(tiny_loaded)
    ref.add_request("a", PROMPTS[0], SamplingParams(max_tokens=2))
    assert mixed[0] == drain(ref)["a"][1]


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_bf16_runs(tiny_llama_dir, dtype):
    from llumnix.model import load_model

    lo = load_model(str(tiny_llama_dir[0]), dtype=dtype)
    eng = real_engine(lo)
    eng.add_request("r", PROMPTS[1], SamplingParams(max_tokens=5))
    assert len(drain(eng)["r"]) == 5


def test_a_panelled_output_head_gives_the_same_logits_and_embeddings(tiny_llama_dir, monkeypatch):
    """On CPU a wide output projection is kept in column panels; with 64-column panels
    the tiny model's 257-token vocabulary spans five, the last one padded."""
    from llumnix.model import llama, load_model

    plain = load_model(str(tiny_llama_dir[0])).model
    assert plain._panels is None  # 257 columns: below the real panel width
    monkeypatch.setattr(llama, "HEAD_PANEL", 64)
    panelled = load_model(str(tiny_llama_dir[0])).model
    assert panelled._panels is not None and tuple(panelled._panels.shape) == (5, 64, 64)
    ids = torch.tensor([0, 5, 63, 64, 200, 256])
    torch.testing.assert_close(panelled.embed_tokens(ids), plain.embed_tokens(ids), atol=0, rtol=0)
    torch.testing.assert_close(panelled.lm_head, plain.lm_head, atol=0, rtol=0)
    h = torch.randn(3, plain.config.hidden_size)
    torch.testing.assert_close(panelled.logits(h), plain.logits(h), atol=1e-5, rtol=1e-5)
    assert panelled.logits(h).shape == (3, 257)
