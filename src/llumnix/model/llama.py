"""A Llama-family forward pass in plain PyTorch over a paged KV cache.

All requests of a step are flattened into one token axis (T tokens). Each
layer writes its new keys/values into the cache slots of those tokens, then
every request attends over its whole context read back through its block
table; so prefill, decode and any mix of them share one path::

    slot(token at position p) = block_table[p // block_size] * block_size + p % block_size
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llumnix.model.config import LlamaConfig
from llumnix.model.quant import (
    HEAD_FORMAT,
    Bf16Weight,
    Int8Weight,
    PackedHead,
    Weight,
    matmul,
    matmul_f32,
    pack,
    pack_head,
)


@dataclass
class LayerWeights:
    """Projection weights are stored transposed, [in, out], and applied as ``x @ w``:
    on CPU that is about twice as fast as ``F.linear`` for one-token decode (the
    GEMV streams rows instead of columns) and no slower for large batches."""

    attn_norm: torch.Tensor
    wqkv: Weight  # [hidden, q_size + 2 * kv_size]: Q, K and V fused in one matmul
    wo: Weight  # [q_size, hidden]
    ffn_norm: torch.Tensor
    w_gate_up: Weight  # [hidden, 2 * intermediate]: gate and up fused
    w_down: Weight  # [intermediate, hidden]

    def packed(self, fmt: str) -> LayerWeights:
        """Norms are copied: a view left on the weight cache's memory map would keep the
        whole float32 file mapped, and the pages packing touched resident."""
        return LayerWeights(self.attn_norm.clone(), pack(self._dense(self.wqkv), fmt),
                            pack(self._dense(self.wo), fmt), self.ffn_norm.clone(),
                            pack(self._dense(self.w_gate_up), fmt), pack(self._dense(self.w_down), fmt))

    @staticmethod
    def _dense(w: Weight) -> torch.Tensor:
        if not isinstance(w, torch.Tensor):
            raise ValueError("weights are packed already")
        return w


@dataclass
class AttnGroup:
    """Requests of one step whose attention is computed together: a contiguous run of
    the batch's tokens (``rows``) and the index tensors that read their contexts."""

    rows: slice  # their tokens in T
    block_tables: torch.Tensor  # [B, nb] each request's blocks covering its context (padded)
    ctx_len: int  # L = longest context; keys beyond a request's own length are masked
    mask: torch.Tensor | None  # [B, 1, Q, L] True = may attend; None = attend to all
    tok_b: torch.Tensor | None  # [T] request of each token (None when every request has 1 token)
    tok_i: torch.Tensor | None  # [T] its row in the padded query block
    q_len: int  # Q, padded queries per request
    fresh_causal: bool  # one request prefilled from position 0: attend over fresh K/V


@dataclass
class ForwardBatch:
    """Index tensors for one step, built once and shared by every layer. Attention runs
    per group: one for a plain prefill or decode step; a step that mixes decodes with
    prefill chunks has one of each, so the decodes are not padded to the chunk's length."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T] flat cache slot of each new token
    last_idx: torch.Tensor  # [S] index in T of the last token of each request that samples
    groups: list[AttnGroup]


HEAD_PANEL = 4096
"""Columns per panel of the CPU output projection. A few rows times the whole
[576, 49152] SmolLM2 head as one matmul takes a slow BLAS path; panel by panel, each
panel contiguous, it is 1.4x-1.8x faster for 4-8 rows (8 rows: 42.8 -> 23.7 ms, single
thread) and 1 ms slower for one row (7.0 -> 8.1 ms). benchmarks/head_panels.py measures
it (results/head_panels.json)."""


def _to_panels(w: torch.Tensor) -> torch.Tensor:
    """[hidden, vocab] -> contiguous [n, hidden, HEAD_PANEL], the last panel zero-padded."""
    hidden, vocab = w.shape
    n = -(-vocab // HEAD_PANEL)
    panels = w.new_zeros(n, hidden, HEAD_PANEL)
    for i in range(n):
        cols = w[:, i * HEAD_PANEL:(i + 1) * HEAD_PANEL]
        panels[i, :, :cols.shape[1]] = cols
    return panels


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def add_residual(h: torch.Tensor, x: torch.Tensor, w: Weight) -> None:
    """``h += x @ w`` in place: one BLAS call with beta = 1 for a float weight, so the
    residual add costs neither an op nor a [T, hidden] allocation; a packed weight's
    bfloat16 product is added as it is (no cast back to float32 first: same sum)."""
    if isinstance(w, torch.Tensor):
        h.addmm_(x, w)
    else:
        h.add_(w.mm_bf16(x))


class LlamaModel:
    def __init__(self, config: LlamaConfig, lm_head: torch.Tensor | PackedHead, layers: list[LayerWeights],
                 norm: torch.Tensor, embed: torch.Tensor | None = None, weight_format: str = "fp32",
                 embed_rows: Int8Weight | None = None) -> None:
        """``lm_head`` is [hidden, vocab]. Tied embeddings (``embed`` None) read
        their rows as columns of the same tensor: one copy, not two. On CPU the
        output projection is kept in column panels (``HEAD_PANEL``). A model packed
        before (the weight cache's) comes with its packed head and its ``weight_format``,
        and where that head is int4 and tied, the embedding's int8 rows (``embed_rows``)."""
        self.config = config
        self._head: torch.Tensor | None = None
        self._panels: torch.Tensor | None = None  # [n, hidden, HEAD_PANEL] on CPU
        self._qhead: PackedHead | None = None  # a packed head (``pack_weights``)
        self._embed_rows = embed_rows  # a tied embedding's rows where the head cannot give them
        self.weight_format = weight_format
        if not isinstance(lm_head, torch.Tensor):
            self._qhead = lm_head
        elif lm_head.device.type == "cpu" and lm_head.shape[1] > HEAD_PANEL:
            self._panels = _to_panels(lm_head)
        else:
            self._head = lm_head
        self.embed = embed
        self.layers = layers
        self.norm = norm
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64)
                                           / config.head_dim))
        pos = torch.arange(config.max_position_embeddings, dtype=torch.float64)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(norm.dtype).to(norm.device)
        self.sin = emb.sin().to(norm.dtype).to(norm.device)
        # sin with rotate_half's sign folded in: rotate_half(x) * sin == x.roll(d/2) * _sin_signed.
        half = config.head_dim // 2
        self._sin_signed = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)

    def pack_weights(self, fmt: str) -> None:
        """Pack the projections in ``fmt`` (``quant.WEIGHT_FORMATS``), once, at load; the head
        as ``quant.HEAD_FORMAT`` says. A tied int4 head, or w8a8's (its columns smoothed),
        keeps the embedding's rows in int8."""
        if fmt == self.weight_format:
            return
        head = embed_head = self.lm_head
        if HEAD_FORMAT[fmt] == "w8a8":  # SmoothQuant's factors into the float weights first
            from llumnix.model.smooth import smooth_model

            head = smooth_model(self, layers=fmt == "w8a8")
        self.layers = [lw.packed(fmt) for lw in self.layers]
        self._qhead = pack_head(head, fmt)
        tied_apart = self.embed is None and HEAD_FORMAT[fmt] in ("int4", "w8a8")
        self._embed_rows = Int8Weight(embed_head) if tied_apart else None
        self._head = self._panels = None
        self.norm = self.norm.clone()
        self.embed = None if self.embed is None else self.embed.clone()
        self.weight_format = fmt

    @property
    def device(self) -> torch.device:
        return self.norm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.dtype

    @property
    def lm_head(self) -> torch.Tensor:
        """The output projection as one [hidden, vocab] matrix (a copy when panelled or packed)."""
        if self._qhead is not None:
            return self._qhead.dense()[:, :self.config.vocab_size]
        if self._head is not None:
            return self._head
        assert self._panels is not None
        n, hidden, width = self._panels.shape
        return self._panels.permute(1, 0, 2).reshape(hidden, n * width)[:, :self.config.vocab_size]

    @property
    def packed_head(self) -> PackedHead | None:
        return self._qhead

    @property
    def embed_rows(self) -> Int8Weight | None:
        return self._embed_rows

    @property
    def is_tied(self) -> bool:
        return self.embed is None

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed is None:
            if self._embed_rows is not None:
                return self._embed_rows.rows(ids)
            if isinstance(self._qhead, Int8Weight):
                return self._qhead.rows(ids)
            if isinstance(self._qhead, Bf16Weight):
                return self._qhead.w.index_select(1, ids).t().float()
            if self._panels is not None:
                return self._panels[ids // HEAD_PANEL, :, ids % HEAD_PANEL]
            assert self._head is not None
            return self._head.index_select(1, ids).t()
        return F.embedding(ids, self.embed)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` [B, hidden] -> [B, vocab]."""
        if self._qhead is not None:
            out = self._qhead.mm(h)  # an int4 head may have zero columns past the vocabulary
            return out if out.shape[1] == self.config.vocab_size else out[:, :self.config.vocab_size]
        if self._panels is None:
            assert self._head is not None
            return h @ self._head
        out = torch.cat([h @ panel for panel in self._panels], dim=1)
        return out[:, :self.config.vocab_size]

    def forward(self, fb: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        """Logits of each request's last token, [B, vocab]. ``kv_cache`` is
        [layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
        return self.logits(self._final_norm(self._trunk(fb, kv_cache)[fb.last_idx])).float()

    def forward_rows(self, fb: ForwardBatch, kv_cache: torch.Tensor,
                     rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s logits, and the final hidden states of the batch's tokens at
        ``rows`` (for prompt logprobs: the caller applies ``logits`` to them in slices,
        since a long prompt's logits at every position would be large)."""
        h = self._trunk(fb, kv_cache)
        return self.logits(self._final_norm(h[fb.last_idx])).float(), self._final_norm(h[rows])

    def _final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(h, (self.config.hidden_size,), self.norm, self.config.rms_norm_eps)

    def _trunk(self, fb: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        """Every token's hidden state after the last layer (before the final norm). RoPE
        rotates Q and K together and in place in the fused QKV output (the sign of
        rotate_half folded into a sin table), so the new K and V stay side by side there
        and enter the cache in one ``index_copy_``; residuals are added in place. Each op
        saved here is saved 30 times a step, and at batch 1 a step is mostly such ops.

        Packed formats feed their kernels bfloat16: each norm's last multiply writes it
        into one buffer of the step (the cast costs no op of its own, and the values are
        those of a cast after it), and the MLP's SiLU and product run on the kernel's
        bfloat16 gate and up, whose product enters the down projection as it is. The
        residual stream, RoPE, attention and the KV cache stay float32."""
        cfg = self.config
        h = self.embed_tokens(fb.input_ids).contiguous()
        n = h.shape[0]
        cos = self.cos[fb.positions].unsqueeze(1)
        sin = self._sin_signed[fb.positions].unsqueeze(1)
        half, q_size, kv_size = cfg.head_dim // 2, cfg.q_size, cfg.kv_size
        xbuf = None if self.weight_format in ("fp32", "w8a8") else h.new_empty(h.shape, dtype=torch.bfloat16)
        for lw, kv in zip(self.layers, kv_cache.unbind(0), strict=True):
            x = self._norm(h, lw.attn_norm, xbuf)
            qkv = matmul_f32(x, lw.wqkv)  # [T, q | k | v], a fresh tensor: rotated in place
            qk = qkv[:, :q_size + kv_size].view(n, -1, cfg.head_dim)
            rolled = qk.roll(half, -1)
            qk.mul_(cos).addcmul_(rolled, sin)  # RoPE
            new_kv = qkv[:, q_size:].view(n, 2, kv_size).transpose(0, 1)  # [2, T, kv_size]
            kv.view(2, -1, kv_size).index_copy_(1, fb.slot_mapping, new_kv)
            add_residual(h, self._attention(fb, qkv, kv), lw.wo)
            x = self._norm(h, lw.ffn_norm, xbuf)
            gate, up = matmul(x, lw.w_gate_up).chunk(2, dim=-1)
            add_residual(h, F.silu(gate).mul_(up), lw.w_down)
        return h

    def _norm(self, h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """RMSNorm of ``h``; into ``out`` (bfloat16) when given: F.rms_norm's own last
        multiply done with ``out=``, so the result is the float32 one rounded once."""
        shape, eps = (self.config.hidden_size,), self.config.rms_norm_eps
        if out is None:
            return F.rms_norm(h, shape, weight, eps)
        return torch.mul(F.rms_norm(h, shape, None, eps), weight, out=out)

    def _attention(self, fb: ForwardBatch, qkv: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """``qkv`` [T, q | k | v] rotated; ``kv`` this layer's cache [2, blocks, block_size,
        kv_heads, head_dim], the step's K/V written already."""
        if len(fb.groups) == 1:
            return self._group_attention(fb.groups[0], qkv, kv)
        return torch.cat([self._group_attention(g, qkv[g.rows], kv) for g in fb.groups])

    def _group_attention(self, g: AttnGroup, qkv: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """One group's attention output [its tokens, q_size]; its K/V are in the cache."""
        cfg = self.config
        heads, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        n, q = qkv.shape[0], qkv[:, :cfg.q_size]
        if g.fresh_causal:
            k, v = qkv[:, cfg.q_size:].view(n, 2, kvh, hd).unbind(1)
            out = F.scaled_dot_product_attention(
                q.view(n, heads, hd).transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0), is_causal=True, enable_gqa=True)
            return out.squeeze(0).transpose(0, 1).reshape(-1, cfg.q_size)
        # Gather whole blocks, K and V at once (index_select over block ids is far cheaper
        # than gathering L single slots), then view them as one context per request.
        b, nb = g.block_tables.shape
        ctx = kv.index_select(1, g.block_tables.view(-1)).view(2, b, nb * kv.shape[2], kvh, hd)
        if g.ctx_len < ctx.shape[2]:
            ctx = ctx[:, :, :g.ctx_len]
        keys, values = ctx.transpose(2, 3).unbind(0)  # [B, kvh, L, hd] each
        if g.tok_b is None:
            # Decode: one query per request. The CPU flash kernel reads the strided K/V
            # views as they are; two matmuls and a softmax copied them first (1.4x slower
            # at batch 1, 2.4x at 32: engine_speed.md, section 9).
            out = F.scaled_dot_product_attention(q.view(b, heads, 1, hd), keys, values, attn_mask=g.mask,
                                                 enable_gqa=True)
            return out.reshape(b, cfg.q_size)
        queries = q.new_zeros(b, g.q_len, heads, hd)
        queries[g.tok_b, g.tok_i] = q.view(n, heads, hd)
        out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                             attn_mask=g.mask, enable_gqa=True)
        return out.transpose(1, 2)[g.tok_b, g.tok_i].reshape(-1, cfg.q_size)
