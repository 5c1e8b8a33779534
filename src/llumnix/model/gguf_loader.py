"""Load a Llama-family GGUF file: dequantize tensor by tensor, undo llama.cpp's Q/K permutation."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from llumnix.core.errors import ModelLoadError
from llumnix.model.config import LlamaConfig
from llumnix.model.gguf_file import read_fields as read_fields  # here before gguf_file
from llumnix.model.llama import LayerWeights, LlamaModel


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's convert-time permutation of Q/K rows (interleaved RoPE
    pairs -> the halves layout that rotate-half RoPE expects)."""
    # llama.cpp: w.reshape(n_head, 2, d, ...).swapaxes(1, 2); so swap back from (n_head, d, 2, ...).
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _t(w: torch.Tensor) -> torch.Tensor:
    """[out, in] -> contiguous [in, out], the layout LlamaModel multiplies with."""
    return w.t().contiguous()


def load_gguf(path: Path, device: str, dtype: torch.dtype,
              weight_format: str = "fp32") -> tuple[LlamaConfig, LlamaModel, Any]:
    """The model with its projections in ``weight_format`` (packed ones from the weight
    cache when there, else packed from the float tensors and cached)."""
    from llumnix.model import weight_cache
    from llumnix.model.gguf_file import GGUFFile

    try:
        reader = GGUFFile(path)
    except Exception as e:  # noqa: BLE001 - report any parse failure as a load error
        raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e
    fields = read_fields(reader)
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    tensors = {t.name: t for t in reader.tensors}
    config = LlamaConfig.from_gguf_fields(fields, vocab_size=int(tensors["token_embd.weight"].shape[-1]))
    if weight_format != "fp32":
        packed = weight_cache.load(path, dtype, weight_format)
        if packed is not None:
            return config, _assemble_packed(config, packed, weight_format), reader
    weights = weight_cache.load(path, dtype)
    if weights is None:
        weights = _weights(path, tensors, config, dtype)
        weight_cache.save(path, dtype, weights)
    model = _assemble(config, weights, device)
    if weight_format != "fp32":
        del weights  # the float tensors' pages go with the model's references to them
        model.pack_weights(weight_format)
        weight_cache.save(path, dtype, packed_tensors(model), weight_format)
    return config, model, reader


LAYER_FIELDS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")


def _weights(path: Path, tensors: dict[str, Any], config: LlamaConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor the model keeps, on CPU in ``dtype``, by name (what the weight cache
    stores): ``layers.{i}.{field}``, ``norm``, ``lm_head`` ([hidden, vocab]) and, for
    untied embeddings, ``embed``."""
    from llumnix.model.gguf_file import dequantize

    def get(name: str, n_head: int | None = None) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        arr = dequantize(t.data, t.tensor_type)
        arr = arr.reshape([int(x) for x in reversed(t.shape)])
        if n_head is not None:
            arr = unpermute(arr, n_head)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not arr.flags.writeable:
            arr = arr.copy()  # F32 tensors come straight from the read-only memory map
        return torch.from_numpy(arr).to(dtype=dtype)

    out: dict[str, torch.Tensor] = {}
    for i in range(config.num_layers):
        p, q = f"blk.{i}.", f"layers.{i}."
        wqkv = torch.cat([get(p + "attn_q.weight", config.num_heads),
                          get(p + "attn_k.weight", config.num_kv_heads),
                          get(p + "attn_v.weight")])
        gate_up = torch.cat([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")])
        out |= {q + "attn_norm": get(p + "attn_norm.weight"), q + "wqkv": _t(wqkv),
                q + "wo": _t(get(p + "attn_output.weight")), q + "ffn_norm": get(p + "ffn_norm.weight"),
                q + "w_gate_up": _t(gate_up), q + "w_down": _t(get(p + "ffn_down.weight"))}
        del wqkv, gate_up
    embed = get("token_embd.weight")
    out["norm"] = get("output_norm.weight")
    if config.tie_word_embeddings:
        out["lm_head"] = _t(embed)
    else:
        out["lm_head"], out["embed"] = _t(get("output.weight")), embed
    return out


def _assemble(config: LlamaConfig, w: dict[str, torch.Tensor], device: str) -> LlamaModel:
    def on(name: str) -> torch.Tensor:
        return w[name].to(device)

    layers = [LayerWeights(**{f: on(f"layers.{i}.{f}") for f in LAYER_FIELDS}) for i in range(config.num_layers)]
    return LlamaModel(config, on("lm_head"), layers, on("norm"), on("embed") if "embed" in w else None)


def packed_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """A packed model's tensors by name (what the weight cache stores for its format):
    ``layers.{i}.{field}`` (norms) or ``layers.{i}.{field}.{part}`` (a packed weight's
    parts), ``norm``, ``head.{part}``, a tied int4 head's ``embed_rows.{part}`` and, for
    untied embeddings, ``embed``."""
    out: dict[str, torch.Tensor] = {"norm": model.norm}
    for i, lw in enumerate(model.layers):
        for f in LAYER_FIELDS:
            w = getattr(lw, f)
            if isinstance(w, torch.Tensor):
                out[f"layers.{i}.{f}"] = w
            else:
                out |= {f"layers.{i}.{f}.{k}": t for k, t in w.tensors().items()}
    head = model.packed_head
    assert head is not None, "packed_tensors needs a packed model"
    out |= {f"head.{k}": t for k, t in head.tensors().items()}
    if model.embed_rows is not None:
        out |= {f"embed_rows.{k}": t for k, t in model.embed_rows.tensors().items()}
    if model.embed is not None:
        out["embed"] = model.embed
    return out


def _assemble_packed(config: LlamaConfig, w: dict[str, torch.Tensor], fmt: str) -> LlamaModel:
    from llumnix.model.quant import HEAD_FORMAT, HEADS, PACKED, Int8Weight

    def parts(prefix: str) -> dict[str, torch.Tensor]:
        return {k.removeprefix(prefix): t for k, t in w.items() if k.startswith(prefix)}

    def field(i: int, f: str) -> Any:
        name = f"layers.{i}.{f}"
        return w[name] if f.endswith("norm") else PACKED[fmt].of(parts(name + "."))

    layers = [LayerWeights(**{f: field(i, f) for f in LAYER_FIELDS}) for i in range(config.num_layers)]
    head = HEADS[HEAD_FORMAT[fmt]].of(parts("head."))
    rows = parts("embed_rows.")
    return LlamaModel(config, head, layers, w["norm"], w.get("embed"), weight_format=fmt,
                      embed_rows=Int8Weight.of(rows) if rows else None)
