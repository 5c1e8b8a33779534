"""Load a Hugging Face Llama directory: config.json + *.safetensors (+ index)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from llumnix.core.errors import ModelLoadError
from llumnix.model.config import LlamaConfig
from llumnix.model.gguf_loader import _t
from llumnix.model.llama import LayerWeights, LlamaModel

_SUPPORTED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}


def load_hf_dir(path: Path, device: str, dtype: torch.dtype) -> tuple[LlamaConfig, LlamaModel]:
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"{path} has no config.json")
    raw = json.loads(cfg_file.read_text())
    archs = set(raw.get("architectures") or ["LlamaForCausalLM"])
    if not archs & _SUPPORTED:
        raise ModelLoadError(f"{path}: architecture {sorted(archs)} is not supported")
    if raw.get("attention_bias") or archs == {"Qwen2ForCausalLM"}:
        raise ModelLoadError(f"{path}: attention biases are not supported yet")
    config = LlamaConfig.from_hf(raw)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors files")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                where[k] = f

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        with safe_open(str(where[name]), framework="pt") as sf:
            tensor: torch.Tensor = sf.get_tensor(name).to(device, dtype)
            return tensor

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        layers.append(LayerWeights(
            attn_norm=get(p + "input_layernorm.weight"),
            wqkv=_t(torch.cat([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"])),
            wo=_t(get(p + "self_attn.o_proj.weight")),
            ffn_norm=get(p + "post_attention_layernorm.weight"),
            w_gate_up=_t(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])),
            w_down=_t(get(p + "mlp.down_proj.weight"))))
    embed = get("model.embed_tokens.weight")
    norm = get("model.norm.weight")
    if config.tie_word_embeddings or "lm_head.weight" not in where:
        return config, LlamaModel(config, _t(embed), layers, norm)
    return config, LlamaModel(config, _t(get("lm_head.weight")), layers, norm, embed)
