"""What one decode step costs in dispatched ops, which load cannot move. At batch 1 a
CPU step is mostly small ops (tens of microseconds of Python and dispatch each, once per
layer: 30 times a step for SmolLM2), so the count per layer is the figure to hold, and a
bigger batch must add none (no per-request loop in the layer)."""
from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llumnix.model import ModelExecutor
from llumnix.model.llama import LlamaModel, add_residual
from llumnix.model.quant import WEIGHT_FORMATS, pack

OPS_PER_LAYER = 29
"""Ops one decoder layer dispatches in a decode step: 42 before the in-place RoPE over the
fused QKV output, one index_copy_ and one gather of K and V together, and decode attention
in one SDPA call."""


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _decode_ops(model: LlamaModel, batch: int, context: int = 37) -> Counter[str]:
    """Ops of one decode step of ``batch`` requests, each ``context`` tokens long."""
    ex = ModelExecutor(model, num_blocks=batch * 10 + 1, block_size=4)
    per = -(-context // 4)
    reqs = [SimpleNamespace(token_ids=[5 + b], start_pos=context - 1, context_len=context, sample=True,
                            block_ids=list(range(b * per, (b + 1) * per))) for b in range(batch)]
    fb = ex._build(SimpleNamespace(scheduled=reqs))
    with torch.inference_mode(), _Ops() as mode:
        ex.model.forward(fb, ex.kv_cache)
    return mode.ops


def _deeper(model: LlamaModel) -> LlamaModel:
    """The same model with its layers twice over: the difference in ops is the layers'."""
    cfg = dataclasses.replace(model.config, num_layers=2 * model.config.num_layers)
    return LlamaModel(cfg, model.lm_head, model.layers * 2, model.norm, model.embed)


@pytest.mark.parametrize("batch", [1, 8])
def test_a_decode_layer_dispatches_at_most_its_budget_of_ops_at_any_batch(tiny_loaded, batch):
    model = tiny_loaded.model
    layers = model.config.num_layers
    per_layer = _decode_ops(_deeper(model), batch) - _decode_ops(model, batch)
    assert sum(per_layer.values()) <= OPS_PER_LAYER * layers, dict(per_layer)
    assert per_layer == _decode_ops(_deeper(model), 1) - _decode_ops(model, 1)  # none per request


@pytest.mark.parametrize("fmt", [f for f in WEIGHT_FORMATS if f != "fp32"])
@pytest.mark.parametrize("rows", [1, 20])
def test_a_packed_residual_adds_the_kernels_product_exactly(fmt, rows):
    """``add_residual`` adds the bfloat16 product without casting it back first."""
    g = torch.Generator().manual_seed(0)
    w = pack(torch.randn(64, 32, generator=g) * 0.1, fmt)
    x, h = torch.randn(rows, 64, generator=g), torch.randn(rows, 32, generator=g)
    want = h + w.mm(x)  # type: ignore[union-attr]
    add_residual(h, x, w)
    assert torch.equal(h, want)
