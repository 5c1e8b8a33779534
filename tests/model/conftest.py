from __future__ import annotations

import json

import pytest
import torch


def _byte_tokenizer_json() -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return json.loads(tok.to_str())


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama saved as a Hugging Face directory, and its transformers twin."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=256)
    model = LlamaForCausalLM(cfg).eval()
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(json.dumps(_byte_tokenizer_json()))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return d, model


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llama_dir):
    from llumnix.model import load_model

    return load_model(str(tiny_llama_dir[0]))
