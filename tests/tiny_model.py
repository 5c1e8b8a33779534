"""A tiny random Llama saved as a Hugging Face directory, for tests that need a real
model but not a big one (cluster, migration)."""
from __future__ import annotations

import json
from pathlib import Path


def byte_tokenizer_json() -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return json.loads(tok.to_str())


def save_tiny_llama(d: Path, seed: int = 0):
    """Write the model and its tokenizer into ``d``; returns the transformers model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=256)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return model
