"""The ``w8a8`` format: SmoothQuant's folding leaves the float model's outputs as they
were, and a step's rows are quantized each on its own scale."""
from __future__ import annotations

import torch

from llumnix.model import smooth
from llumnix.model.quant import W8A8Weight, matmul


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The float model's logits at every position of one prefill of ``ids``."""
    from llumnix.model.llama import AttnGroup, ForwardBatch

    cfg, n = model.config, ids.shape[0]
    kv = torch.zeros(cfg.num_layers, 2, -(-n // 4), 4, cfg.num_kv_heads, cfg.head_dim)
    group = AttnGroup(rows=slice(0, n), block_tables=torch.arange(kv.shape[2]).view(1, -1), ctx_len=n,
                      mask=None, tok_b=None, tok_i=None, q_len=n, fresh_causal=True)
    pos = torch.arange(n)
    with torch.inference_mode():
        return model.forward(ForwardBatch(ids, pos, pos, pos, [group]), kv)


def test_smoothing_leaves_the_float_model_s_outputs_unchanged(tiny_llama_dir):
    """The factors are folded into the norms, up and the head: x @ w is unchanged in exact
    arithmetic, so the float model computes the same logits (to float32 rounding) with
    other weights."""
    from llumnix.model import load_model

    model = load_model(str(tiny_llama_dir[0])).model
    ids = torch.tensor([3, 200, 17, 45, 99, 250, 1, 64])
    before, norm, w_down = _logits(model, ids), model.layers[0].attn_norm, model.layers[0].w_down
    table = model.lm_head.t().contiguous()  # the tied embedding, which smoothing leaves alone
    model._head, model.embed = smooth.smooth_model(model), table
    after = _logits(model, ids)
    assert _rel(after, before) < 1e-4
    assert _rel(model.layers[0].attn_norm, norm) > 0.01 and _rel(model.layers[0].w_down, w_down) > 0.01


def test_a_token_s_outliers_cost_the_other_rows_no_precision():
    """Rows are scaled to one range before fbgemm's single per-call scale: a row 1000x the
    others leaves their products as precise as alone (a shared scale would round them to 0)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g) * 0.05
    x = torch.randn(6, 96, generator=g)
    x[0] *= 1000
    y = matmul(x, W8A8Weight(w))
    for i in range(6):
        assert _rel(y[i], x[i] @ w) < 0.03, i
    alone = matmul(x[3:4], W8A8Weight(w))
    assert _rel(y[3], alone[0]) < 0.02


def test_a_tied_w8a8_model_embeds_with_the_unsmoothed_rows(tiny_llama_dir):
    """The packed head's columns carry the final norm's factors, so a tied embedding reads
    the int8 rows kept beside it, which are int8's own."""
    from llumnix.model import load_model

    path = str(tiny_llama_dir[0])
    fast, int8 = load_model(path, weight_format="w8a8").model, load_model(path, weight_format="int8").model
    assert isinstance(fast.packed_head, W8A8Weight) and fast.embed_rows is not None
    ids = torch.tensor([0, 7, 256])
    assert torch.equal(fast.embed_tokens(ids), int8.embed_tokens(ids))


def test_a_w8a8_head_beside_auto_layers_smooths_only_the_head(tiny_llama_dir, monkeypatch):
    """``auto/w8a8`` (the benchmark's arm; HEAD_FORMAT's choice): int4/bf16 layers as
    auto's, unsmoothed, and the w8a8 head with the final norm's factors."""
    from llumnix.model import load_model, quant

    path = str(tiny_llama_dir[0])
    exact, auto = load_model(path).model, load_model(path, weight_format="auto").model
    monkeypatch.setitem(quant.HEAD_FORMAT, "auto", "w8a8")
    mixed = load_model(path, weight_format="auto").model
    assert isinstance(mixed.packed_head, W8A8Weight) and mixed.embed_rows is not None
    assert torch.equal(mixed.layers[0].attn_norm, auto.layers[0].attn_norm)
    assert not torch.equal(mixed.norm, auto.norm)
    h = torch.randn(3, exact.config.hidden_size)
    assert _rel(mixed.logits(mixed._final_norm(h)), exact.logits(exact._final_norm(h))) < 0.05
