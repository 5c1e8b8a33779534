"""A tiny random Llama for the paced cluster (issue 45, `paced_scale.sh`): a Hugging Face
directory whose real steps stay far under the paced latency model's (`--pace`), so every
instance's step time is the model's however many instances share the CPU.

    python -m benchmarks.cluster.tiny_model OUT_DIR [--context 2048]

2 layers, hidden 64, 4 heads (2 KV heads), vocab 257 (a byte-level tokenizer: the trace's
prompts are token ids and its lengths come from SmolLM2's tokenizer, `--trace-tokenizer
smollm2`), ``--context`` positions (ShareGPT's prompts and outputs, capped). Its outputs are
noise; what it keeps real is every step's batch, KV cache, preemption and migration. A
block of 16 tokens is 4 KiB of KV (2 layers x K,V x 2 heads x 16 dims x 16 tokens x 4 B).
Needs torch, transformers and tokenizers (the test extras). Rewrites nothing that exists.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def byte_tokenizer_json() -> dict:
    """A byte-level BPE with no merges (each byte one token) and an end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    vocab["<|end|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return dict(json.loads(tok.to_str()))


def write_tiny_llama(out: Path, context: int = 2048, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=256)
    out.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(cfg).eval().save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--context", type=int, default=2048, help="positions (the longest request)")
    a = ap.parse_args()
    print(write_tiny_llama(a.out, a.context))


if __name__ == "__main__":
    main()
