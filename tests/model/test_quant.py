"""The packed weight formats: each kernel computes ``x @ w`` for the weight it packed, a
GGUF Q4_1 tensor survives int4 packing, and a packed model runs and is selected by config."""
from __future__ import annotations

import pytest
import torch

from llumnix.config.fields import SystemConfigError
from llumnix.config.sections import WEIGHT_FORMATS as CONFIG_FORMATS
from llumnix.config.sections import LLMConfig
from llumnix.core.errors import ModelLoadError
from llumnix.model.quant import (
    DENSE_ROWS,
    HEAD_FORMAT,
    WEIGHT_FORMATS,
    Bf16Weight,
    Int4Weight,
    Int8Weight,
    RowAwareWeight,
    matmul,
    pack,
    pack_head,
    weight_bytes,
)

# Relative error of x @ w against float32 (bf16 activations: about 2^-8 per product).
TOLERANCE = {"fp32": 1e-6, "bf16": 0.02, "int8": 0.03, "int4": 0.12, "auto": 0.12, "w8a8": 0.03}
# Bytes kept per weight: auto keeps int4's and a bf16 copy; w8a8 its int8 and fbgemm's packing of it.
BYTES_PER_WEIGHT = {"bf16": 2.0, "int8": 1.05, "int4": 0.65, "auto": 2.65, "w8a8": 2.1}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("batch", [1, 5, 32])
def test_packed_matmul_matches_float32(fmt, batch):
    g = torch.Generator().manual_seed(batch)
    w = torch.randn(96, 160, generator=g) * 0.05
    x = torch.randn(batch, 96, generator=g)
    packed = pack(w, fmt)
    y = matmul(x, packed)
    assert y.dtype == torch.float32 and y.shape == (batch, 160)
    assert _rel(y, x @ w) < TOLERANCE[fmt]
    if fmt != "fp32":
        assert weight_bytes(packed) <= w.numel() * BYTES_PER_WEIGHT[fmt]  # the point: fewer bytes per step


@pytest.mark.parametrize("batch", [1, DENSE_ROWS - 1, DENSE_ROWS, 32])
def test_auto_runs_int4_below_dense_rows_and_bf16_from_there(batch):
    """Bit for bit one single path or the other, chosen by rows; the bf16 copy holds the
    int4 weights (so the two paths differ by rounding, not by quantization)."""
    g = torch.Generator().manual_seed(batch)
    w = torch.randn(96, 160, generator=g) * 0.05
    x = torch.randn(batch, 96, generator=g)
    auto = RowAwareWeight(w)
    single = Int4Weight(w) if batch < DENSE_ROWS else Bf16Weight(Int4Weight(w).dense())
    assert torch.equal(auto.mm(x), single.mm(x))
    assert torch.equal(auto.int4.packed, Int4Weight(w).packed)
    int4_dense = Int4Weight(w).dense()  # the kernel's own view, bf16-rounded
    assert torch.equal(auto.bf16.w, int4_dense.to(torch.bfloat16))


def test_int4_gives_back_a_q4_1_tensor():
    """A Q4_1 block is w = d*q + m with its min at q=0 and its max at q=15: min/max
    re-quantization recovers d, m and q, so the packed tensor is the file's own."""
    g = torch.Generator().manual_seed(0)
    d = torch.rand(64, 3, 1, generator=g) * 0.01 + 1e-3
    m = -torch.rand(64, 3, 1, generator=g) * 0.05
    q = torch.randint(0, 16, (64, 3, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # a Q4_1 block's own min and max
    w_out_in = (d * q + m).view(64, 96)
    dense = Int4Weight(w_out_in.t()).dense().t().reshape(64, 3, 32)
    steps = (dense - m) / d  # the integers the packed tensor holds, in the file's own units
    assert torch.equal(steps.round(), q)
    # The kernel's scales and zero points are bf16: each weight moves by under 0.2 of its step.
    assert float((steps - q).abs().max()) < 0.2


def test_int8_rows_are_the_embedding_of_a_tied_head():
    w = torch.randn(32, 50) * 0.1  # [hidden, vocab]
    head = Int8Weight(w)
    ids = torch.tensor([0, 7, 49])
    assert _rel(head.rows(ids), w[:, ids].t()) < 0.01


def test_int4_refuses_a_width_it_cannot_group():
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Weight(torch.randn(48, 64))


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4", "auto", "w8a8"])
def test_a_packed_model_tracks_float32(tiny_llama_dir, fmt):
    """Logits within the head format's matmul tolerance (an int4 head's is int4's); the
    embedding within int8's, whatever the head: a tied int4 head keeps int8 rows for it."""
    from llumnix.model import load_model

    exact = load_model(str(tiny_llama_dir[0]))
    fast = load_model(str(tiny_llama_dir[0]), weight_format=fmt)
    assert fast.model.weight_format == fmt and exact.model.weight_format == "fp32"
    h = torch.randn(3, exact.config.hidden_size)  # before the final norm (w8a8 folds factors into it)
    logits = fast.model.logits(fast.model._final_norm(h))
    assert logits.shape == (3, exact.config.vocab_size)  # 257: the int4 head's padding sliced off
    assert _rel(logits, exact.model.logits(exact.model._final_norm(h))) < \
        (TOLERANCE["int4"] if HEAD_FORMAT[fmt] == "int4" else 0.05)
    ids = torch.tensor([1, 5, 200])
    assert _rel(fast.model.embed_tokens(ids), exact.model.embed_tokens(ids)) < 0.02


@pytest.mark.parametrize("fmt", ["int4", "auto"])
def test_an_int4_head_keeps_int8_embedding_rows_beside_it(tiny_llama_dir, monkeypatch, fmt):
    """Not the default (it fails the quality bar on SmolLM2), but what HEAD_FORMAT builds
    when asked: the int4 head computes the logits, the int8 rows the tied embedding."""
    from llumnix.model import load_model, quant

    assert quant.HEAD_FORMAT[fmt] == "int8"
    monkeypatch.setitem(quant.HEAD_FORMAT, fmt, "int4")
    model = load_model(str(tiny_llama_dir[0]), weight_format=fmt).model
    int8 = load_model(str(tiny_llama_dir[0]), weight_format="int8").model
    assert isinstance(model.packed_head, Int4Weight) and isinstance(int8.packed_head, Int8Weight)
    assert model.embed_rows is not None and int8.embed_rows is None
    assert torch.equal(model.embed_rows.q, int8.packed_head.q)  # the same rows int8's head embeds with
    ids = torch.tensor([0, 256])
    assert torch.equal(model.embed_tokens(ids), int8.embed_tokens(ids))
    assert weight_bytes(model.packed_head) < 0.7 * weight_bytes(int8.packed_head)
    h = torch.randn(2, model.config.hidden_size)
    assert _rel(model.logits(h), int8.logits(h)) < TOLERANCE["int4"]


@pytest.mark.parametrize("vocab", [48, 50, 257])
def test_an_int4_head_of_any_width_computes_its_logits(monkeypatch, vocab):
    """The int4 kernel takes widths in multiples of 16: other heads are padded, not refused."""
    from llumnix.model import quant

    monkeypatch.setitem(quant.HEAD_FORMAT, "auto", "int4")
    g = torch.Generator().manual_seed(vocab)
    w, x = torch.randn(64, vocab, generator=g) * 0.05, torch.randn(2, 64, generator=g)
    head = pack_head(w, "auto")
    assert isinstance(head, Int4Weight)
    assert _rel(head.mm(x)[:, :vocab], x @ w) < TOLERANCE["int4"]
    assert not head.mm(x)[:, vocab:].any()  # the padding's columns are zero


def test_weight_format_is_checked_at_load_and_in_config():
    from llumnix.config.system import SystemConfig

    assert CONFIG_FORMATS == WEIGHT_FORMATS
    assert SystemConfig.from_dict({"engine": {"weight_format": "int4"}}).engine.llm_kwargs()["weight_format"] == "int4"
    with pytest.raises(SystemConfigError, match="engine.weight_format: must be one of fp32, bf16, int8, int4, auto"):
        SystemConfig.from_dict({"engine": {"weight_format": "int3"}})
    with pytest.raises(SystemConfigError, match="needs device cpu and dtype float32"):
        LLMConfig(weight_format="int8", dtype="bfloat16")
    from llumnix.model import load_model

    with pytest.raises(ModelLoadError, match="weight format int4 needs device cpu and dtype float32"):
        load_model("smollm2", dtype="bfloat16", weight_format="int4")
