"""A model of SmolLM2-135M's exact shape with random weights, as a Hugging Face directory.

A GPU machine that cannot receive the 93 MB GGUF (a device lease carries at most 64 MiB)
still measures the engine's speed and migration faithfully: a step costs the same
whatever the weights hold. Two steps, so only small files travel:

    python benchmarks/gpu/random_model.py export DIR    # here: config.json + tokenizer.json from the GGUF
    python benchmarks/gpu/random_model.py weights DIR   # there: model.safetensors, random (seeded)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def export(out: Path) -> None:
    from gguf import GGUFReader

    from llumnix.model import load_tokenizer
    from llumnix.model.config import LlamaConfig
    from llumnix.model.gguf_loader import read_fields
    from llumnix.model.loader import smollm2_path

    reader = GGUFReader(str(smollm2_path()))
    tok = load_tokenizer("smollm2")
    c = LlamaConfig.from_gguf_fields(read_fields(reader), tok.vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
          "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
          "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
          "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
          "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
          "tie_word_embeddings": c.tie_word_embeddings, "bos_token_id": c.bos_token_id,
          "eos_token_id": c.eos_token_id, "hidden_act": "silu"}
    (out / "config.json").write_text(json.dumps(hf, indent=1) + "\n")
    tok.save(str(out / "tokenizer.json"))
    print(f"wrote {out}/config.json and tokenizer.json ({c.num_layers} layers, hidden {c.hidden_size})")


def weights(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**json.loads((out / "config.json").read_text()))
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    print(f"wrote random weights into {out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["export", "weights"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    export(a.dir) if a.step == "export" else weights(a.dir, a.seed)


if __name__ == "__main__":
    main()
