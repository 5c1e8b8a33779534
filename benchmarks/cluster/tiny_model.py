"""A tiny random Llama for the paced cluster (issue 45, `paced_scale.sh`): a Hugging Face
directory whose real steps stay far under the paced latency model's (`--pace`), so every
instance's step time is the model's however many instances share the CPU.

    python -m benchmarks.cluster.tiny_model OUT_DIR [--context 2048]

2 layers, hidden 64, 4 heads (2 KV heads), vocab 257 (a byte-level tokenizer: the trace's
prompts are token ids and its lengths come from SmolLM2's tokenizer, `--trace-tokenizer
smollm2`; greedy outputs printable ASCII: ``printable_head``), ``--context`` positions (ShareGPT's prompts and outputs, capped). Its outputs are
noise; what it keeps real is every step's batch, KV cache, preemption and migration. A
block of 16 tokens is 4 KiB of KV (2 layers x K,V x 2 heads x 16 dims x 16 tokens x 4 B).
Needs torch, transformers and tokenizers (the test extras). Skips a directory that holds
this version (``tiny_model.json``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from tests.tiny_model import byte_tokenizer_json

VERSION = 2
"""2: the printable output head. A directory stamped with another version is rewritten."""
STAMP = "tiny_model.json"


def printable_head(vocab: dict[str, int], hidden: int, num_tokens: int) -> Any:
    """An output head under which greedy decoding picks printable ASCII only: a random
    model's bytes are mostly invalid UTF-8, which the gateway holds back until a character
    completes (the client's first text, its TTFT, came seconds after the first token).
    The printable tokens' rows come in pairs (v, -v), so for any hidden state one of them
    scores >= 0, and every other row is 0."""
    import torch

    ids = sorted(i for ch, i in vocab.items() if len(ch) == 1 and "!" <= ch <= "~")
    head = torch.zeros(num_tokens, hidden)
    half = len(ids) // 2
    v = torch.randn(half, hidden) / hidden ** 0.5
    head[ids[:half]] = v
    head[ids[half:2 * half]] = -v
    return head


def write_tiny_llama(out: Path, context: int = 2048, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    stamp = {"version": VERSION, "context": context, "seed": seed}
    with contextlib.suppress(OSError, ValueError):
        if json.loads((out / STAMP).read_text()) == stamp:
            return out
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=256)
    tok = byte_tokenizer_json()
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.copy_(printable_head(tok["model"]["vocab"], cfg.hidden_size, cfg.vocab_size))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    (out / STAMP).write_text(json.dumps(stamp))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--context", type=int, default=2048, help="positions (the longest request)")
    a = ap.parse_args()
    print(write_tiny_llama(a.out, a.context))


if __name__ == "__main__":
    main()
