"""Shape of a Llama-family model, read from GGUF metadata or an HF config.json."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llumnix.core.errors import ModelLoadError


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    """Rows of the embedding matrix."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_layers: int
    """Transformer blocks."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when fewer than num_heads)."""
    head_dim: int
    """Width of one head."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    max_position_embeddings: int = 2048
    """Longest sequence the model was trained for."""
    tie_word_embeddings: bool = True
    """The LM head reuses the embedding matrix."""
    bos_token_id: int | None = None
    """Beginning-of-sequence token."""
    eos_token_id: int | None = None
    """End-of-sequence token."""

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_gguf_fields(cls, f: dict[str, Any], vocab_size: int) -> LlamaConfig:
        heads = int(f["llama.attention.head_count"])
        hidden = int(f["llama.embedding_length"])
        return cls(
            vocab_size=int(f.get("llama.vocab_size", vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(f["llama.feed_forward_length"]),
            num_layers=int(f["llama.block_count"]),
            num_heads=heads,
            num_kv_heads=int(f.get("llama.attention.head_count_kv", heads)),
            head_dim=int(f.get("llama.rope.dimension_count", hidden // heads)),
            rms_norm_eps=float(f.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(f.get("llama.rope.freq_base", 10000.0)),
            max_position_embeddings=int(f.get("llama.context_length", 2048)),
            tie_word_embeddings="output.weight" not in f.get("_tensor_names", ()),
            bos_token_id=_opt_int(f.get("tokenizer.ggml.bos_token_id")),
            eos_token_id=_opt_int(f.get("tokenizer.ggml.eos_token_id")),
        )

    @classmethod
    def from_hf(cls, c: dict[str, Any]) -> LlamaConfig:
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        eos = c.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        # transformers 5 keeps theta and the scaling kind in rope_parameters, 4.x at the top.
        rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
        if (rope.get("rope_type") or rope.get("type") or "default") != "default":
            raise ModelLoadError(f"RoPE scaling {rope!r} is not supported (only plain RoPE)")
        return cls(
            vocab_size=int(c["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            bos_token_id=_opt_int(c.get("bos_token_id")),
            eos_token_id=_opt_int(eos),
        )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
