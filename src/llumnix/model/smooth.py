"""SmoothQuant for the ``w8a8`` format: activation outliers moved into the weights, so
8-bit activations keep their precision.

A few input channels of a projection carry activations 10-100x the others' (the
residual stream's "massive" channels, after the norm); quantized to 8 bits per token
with one scale, the other channels round to a few levels. SmoothQuant (Xiao et al.,
2023) divides input channel j by s_j and multiplies the weight's row j by it, which
leaves x @ w unchanged in exact arithmetic:

    s_j = max|x_j| ** alpha / max|w_j| ** (1 - alpha)

Every division is folded into a tensor the model already multiplies by, so it costs no
op a step: the attention and MLP norms' weights (inputs of QKV and gate/up), the up
half of gate/up (the down projection's input is silu(gate) * up), and the final norm
(the head's input). The output projection's input (attention's output) is not smoothed:
its division would fall on V, which the KV cache holds, and the cache's bytes must stay
those of every other format (migration between formats).

``max|x_j|`` comes from one float32 forward over ``calibration_ids`` at packing time.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from llumnix.model.llama import AttnGroup, ForwardBatch, LayerWeights, LlamaModel

ALPHA = 0.4
"""SmoothQuant's migration strength (the paper's default is 0.5). On SmolLM2-135M, 16
prompts and README's 1024 tokens: 0.3 +2.8% perplexity, 0.4 +1.0%, 0.5 +1.3%, 0.65
+2.7%, 0.8 +9.1% (benchmarks/engine_speed.md, section 12)."""
CALIBRATION_TOKENS = 512
BLOCK = 16


class _Probe:
    """A float weight that records its input's per-channel max |x| as the model runs."""

    def __init__(self, w: torch.Tensor, seen: Callable[[torch.Tensor], None]) -> None:
        self.w, self._seen = w, seen

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        self._seen(x)
        return x.float() @ self.w

    mm_bf16 = mm


def calibration_ids(vocab_size: int, n: int = CALIBRATION_TOKENS) -> torch.Tensor:
    """Token ids to calibrate on: fixed, seeded, drawn from the whole vocabulary."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (n,), generator=g)


def activation_maxima(model: LlamaModel, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per input channel, max |x| of each projection's input over one prefill of ``ids``:
    ``"{layer}.{field}"`` and ``"head"``. ``model`` must be float (not packed)."""
    cfg, n = model.config, ids.shape[0]
    seen: dict[str, torch.Tensor] = {}

    def probe(name: str, w: torch.Tensor) -> Any:  # stands in for a weight
        def record(x: torch.Tensor) -> None:
            m = x.detach().abs().amax(0).float()
            seen[name] = m if name not in seen else torch.maximum(seen[name], m)
        return _Probe(w, record)

    saved = model.layers
    model.layers = [LayerWeights(lw.attn_norm, probe(f"{i}.wqkv", _dense(lw.wqkv)), probe(f"{i}.wo", _dense(lw.wo)),
                                 lw.ffn_norm, probe(f"{i}.w_gate_up", _dense(lw.w_gate_up)),
                                 probe(f"{i}.w_down", _dense(lw.w_down)))
                    for i, lw in enumerate(saved)]
    blocks = -(-n // BLOCK)
    kv = torch.zeros(cfg.num_layers, 2, blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)
    group = AttnGroup(rows=slice(0, n), block_tables=torch.arange(blocks).view(1, -1), ctx_len=n, mask=None,
                      tok_b=None, tok_i=None, q_len=n, fresh_causal=True)
    pos = torch.arange(n)
    fb = ForwardBatch(input_ids=ids, positions=pos, slot_mapping=pos, last_idx=pos[-1:], groups=[group])
    try:
        with torch.inference_mode():
            h = model._final_norm(model._trunk(fb, kv))
    finally:
        model.layers = saved
    seen["head"] = h.abs().amax(0).float()
    return seen


def _dense(w: object) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise ValueError("smoothing needs the float weights (before packing)")
    return w


def _factor(x_max: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """s per input channel of ``w`` [in, out]."""
    w_max = w.abs().amax(1).clamp(min=1e-5)
    return (x_max.clamp(min=1e-5) ** alpha / w_max ** (1 - alpha)).clamp(min=1e-5)


def smooth_model(model: LlamaModel, alpha: float = ALPHA, layers: bool = True) -> torch.Tensor:
    """Calibrate ``model`` and fold SmoothQuant's factors into its final norm and (``layers``)
    its layers, in place; the output projection [hidden, vocab] to pack, its rows multiplied
    by the final norm's factors (the model's own head, a tied embedding's table, is left as
    it is). ``layers`` False: a w8a8 head beside another format's layers."""
    maxima = activation_maxima(model, calibration_ids(model.config.vocab_size))
    if layers:
        smooth(model, maxima, alpha)
    head = model.lm_head
    s = _factor(maxima["head"], head, alpha)
    model.norm = model.norm / s
    return head * s[:, None]


def smooth(model: LlamaModel, maxima: dict[str, torch.Tensor], alpha: float = ALPHA) -> None:
    """Fold SmoothQuant's factors into ``model``'s layers in place (x @ w unchanged)."""
    inter = model.config.intermediate_size
    for i, lw in enumerate(model.layers):
        wqkv, w_gate_up, w_down = _dense(lw.wqkv), _dense(lw.w_gate_up), _dense(lw.w_down)
        s = _factor(maxima[f"{i}.wqkv"], wqkv, alpha)
        lw.attn_norm, lw.wqkv = lw.attn_norm / s, wqkv * s[:, None]
        s = _factor(maxima[f"{i}.w_gate_up"], w_gate_up, alpha)
        lw.ffn_norm, w_gate_up = lw.ffn_norm / s, w_gate_up * s[:, None]
        s = _factor(maxima[f"{i}.w_down"], w_down, alpha)
        w_gate_up = torch.cat([w_gate_up[:, :inter], w_gate_up[:, inter:] / s], dim=1)
        lw.w_gate_up, lw.w_down = w_gate_up, w_down * s[:, None]
