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
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from llumnix.model import ModelExecutor
from llumnix.model.llama import LlamaModel, add_residual
from llumnix.model.quant import WEIGHT_FORMATS, pack

OPS_PER_LAYER = {"fp32": 29, "auto": 35}
"""Ops one decoder layer dispatches in a decode step. fp32: 42 before the in-place RoPE
over the fused QKV output, one index_copy_ and one gather of K and V together, and decode
attention in one SDPA call. auto (int4 kernels below 16 rows): 37 before its norms wrote
bfloat16 themselves, its MLP ran on the kernel's bfloat16 and a tensor already in the
dtype wanted was no longer cast to it (a call that does nothing but costs one)."""


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
    return LlamaModel(cfg, model.packed_head or model.lm_head, model.layers * 2, model.norm, model.embed,
                      weight_format=model.weight_format, embed_rows=model.embed_rows)


@pytest.fixture(scope="module")
def tiny_auto(tiny_llama_dir):
    from llumnix.model import load_model

    return load_model(str(tiny_llama_dir[0]), weight_format="auto")


@pytest.mark.parametrize("fmt", ["fp32", "auto"])
@pytest.mark.parametrize("batch", [1, 8])
def test_a_decode_layer_dispatches_at_most_its_budget_of_ops_at_any_batch(tiny_loaded, tiny_auto, fmt, batch):
    model = (tiny_loaded if fmt == "fp32" else tiny_auto).model
    layers = model.config.num_layers
    per_layer = _decode_ops(_deeper(model), batch) - _decode_ops(model, batch)
    assert sum(per_layer.values()) <= OPS_PER_LAYER[fmt] * layers, dict(per_layer)
    assert per_layer == _decode_ops(_deeper(model), 1) - _decode_ops(model, 1)  # none per request


@pytest.mark.parametrize("rows", [1, 20])
def test_a_packed_norm_is_the_float32_norm_rounded_once(tiny_auto, rows):
    """The norm feeding a packed kernel writes bfloat16 in its last multiply: the values
    of F.rms_norm's float32 result cast after it, in the step's one buffer."""
    model = tiny_auto.model
    hidden, eps = model.config.hidden_size, model.config.rms_norm_eps
    g = torch.Generator().manual_seed(rows)
    h, w = torch.randn(rows, hidden, generator=g) * 3, torch.randn(hidden, generator=g)
    out = torch.empty(rows, hidden, dtype=torch.bfloat16)
    got = model._norm(h, w, out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, F.rms_norm(h, (hidden,), w, eps).to(torch.bfloat16))
    assert torch.equal(model._norm(h, w, None), F.rms_norm(h, (hidden,), w, eps))


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
