"""The packaged default model: loading, tokenizer, chat template, a known answer."""
from __future__ import annotations

import pytest

from llumnix.core.errors import ModelLoadError
from llumnix.core.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def smollm2():
    from llumnix.llm import LLM

    return LLM("smollm2", kv_cache_bytes=64 * 2**20)


def test_the_capital_of_france_is_paris(smollm2):
    (out,) = smollm2.generate(["What is the capital of France? Answer in one sentence."],
                              SamplingParams(max_tokens=20), chat=True)
    assert "Paris" in out.text


def test_chat_template_is_the_models_own(smollm2):
    text = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert smollm2.tokenizer.encode("<|im_start|>user", add_special_tokens=False)[0] == 1


def test_eos_stops_generation_and_stop_strings_cut_text(smollm2):
    (out,) = smollm2.generate(["Say hello."], SamplingParams(max_tokens=60), chat=True)
    assert out.finish_reason == "stop" and out.token_ids[-1] == smollm2.tokenizer.eos_token_id
    (cut,) = smollm2.generate(["What is the capital of France? Answer in one sentence."],
                              SamplingParams(max_tokens=20, stop=("Paris",)), chat=True)
    assert "Paris" not in cut.text and cut.finish_reason == "stop"


def test_prompt_too_long_is_rejected_at_admission(smollm2):
    from llumnix.core.errors import RequestTooLongError

    with pytest.raises(RequestTooLongError):
        smollm2.generate([[100] * 9000], SamplingParams(max_tokens=1))


def test_unknown_model_is_a_clear_error():
    from llumnix.model import load_model

    with pytest.raises(ModelLoadError, match="neither"):
        load_model("/no/such/model.gguf")


@pytest.fixture
def parse_the_gguf_once(monkeypatch):
    """transformers reads the GGUF three times (tokenizer, config, tensors: its metadata
    parse is seconds of numpy memmap indexing each time) and rebuilds gguf's tensor-name
    map for every submodule (~400 times): both memoized here, for this test only, which
    then spends its time on what it checks (on the CI's 2 cores: ~2 of its minutes)."""
    import functools

    import gguf

    reader = functools.cache(gguf.GGUFReader)
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, *a, **kw: reader(str(path), *a, **kw))
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))


@pytest.mark.slow
def test_tokenizer_and_greedy_tokens_match_transformers_on_the_gguf(smollm2, parse_the_gguf_once):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = smollm2.loaded.path
    hf_tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    for s in ["Hello world", "The year 2024 had 366 days!", "héllo 日本語 ✓", "a\n\n\tb"]:
        assert smollm2.tokenizer.encode(s) == hf_tok.encode(s)
    hf = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]:
        ids = smollm2.tokenizer.encode(prompt)
        (ours,) = smollm2.generate([ids], SamplingParams(max_tokens=24, ignore_eos=True))
        with torch.inference_mode():
            theirs = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        assert ours.token_ids == theirs.tolist()


def test_saved_tokenizer_json_encodes_as_the_gguf_one(smollm2, tmp_path):
    """What benchmarks/gpu/random_model.py ships to a GPU machine in place of the GGUF."""
    from llumnix.model.tokenizer import Tokenizer

    tok = smollm2.tokenizer
    tok.save(str(tmp_path / "tokenizer.json"))
    again = Tokenizer.from_dir(tmp_path, tok.bos_token_id, tok.eos_token_id)
    text = "<|im_start|>user\nWhat is the capital of France? Ünïcode, numbers 12345.<|im_end|>"
    assert again.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert again.vocab_size == tok.vocab_size
