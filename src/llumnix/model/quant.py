"""Weight formats of the CPU fast path: the model's float32 projections packed once at
load for PyTorch's weight-only kernels, so a decode step streams a fraction of the bytes
(batch-1 decode on a CPU is memory bandwidth over bytes per token).

    fp32  weights as loaded (the engine's dtype): the exact path, HF-parity tested
    bf16  [in, out] bfloat16; activations stay float32, cast around each matmul
    int8  per-output-channel symmetric int8, ``aten._weight_int8pack_mm``
    int4  32-element groups with a scale and a zero point each,
          ``aten._weight_int4pack_mm_for_cpu``. A GGUF Q4_1 block is exactly such a
          group (w = d*q + m, its min at q=0 and its max at q=15), so min/max
          re-quantization of the dequantized tensor gives back the file's own integers
          (its scales and minimums rounded to bf16, the kernel's: a weight moves by up to
          0.16 of its quantization step).
    auto  the kernel chosen by rows: int4's below ``DENSE_ROWS`` rows (decode of a few
          requests, where bytes per token rule), bf16 dense of the same int4 weights at
          ``DENSE_ROWS`` and above (big batches and prefill, where the int kernels pay
          their dequantization again for every few rows). Both are kept: 63 + 203 MiB for
          SmolLM2-135M's layers, with the int8 head (27 MiB), 293 MiB against fp32's 513.
    w8a8  int8 weights per output channel times activations quantized to 8 bits per row at
          each call (``W8A8Weight``, fbgemm's integer GEMM with VNNI dot products): float32
          in and out, and no kernel that dequantizes the weights again for every few rows,
          so it takes the least CPU time a step at every row count here (one thread: batch
          1 0.90x auto's, batch 8 and 32 0.71x); in wall time on two threads it is slower
          than auto at batch 1 and 8 (0.92x, 0.85x) and faster at 32 (1.12x; quiet,
          benchmarks/engine_speed.md, section 12). 8-bit activations need SmoothQuant (``model/smooth.py``, folded in at packing):
          without it perplexity rose 266%; with it +1.0%, but greedy agreement with fp32 is
          9/64 prompts (auto's 42), so it is opt-in. Its head is w8a8 too (its columns
          smoothed), a tied embedding reading int8 rows kept beside it.

The int8 and int4 kernels take bfloat16 activations: with float32 ones PyTorch 2.13 runs
a scalar fallback 10-500x slower than float32 BLAS (576x960 at batch 1, one thread: int4
1.1 ms against 48 us with bf16 input; benchmarks/engine_speed.md). So x is cast to
bfloat16 around each packed matmul (the residual stream, norms, attention and the KV
cache stay float32), and scales and zero points are kept in bfloat16.

The output projection is packed as ``HEAD_FORMAT`` says: int8 per vocabulary row under
int8, int4 and auto, which doubles as a tied embedding table (row ``id`` dequantized), so
the model keeps one copy of it (SmolLM2's is Q8_0 in its GGUF). An int4 head (17 MiB
against 27, and int4's kernel is faster at every row count) is built by ``pack_head``
where ``HEAD_FORMAT`` asks for it, a tied embedding then keeping int8 rows beside it; it
is not the default because it fails the quality bar: SmolLM2 under auto with an int4 head
agreed with fp32 on 3 of 64 prompts' first 16 greedy tokens (42 with int8's) and its
perplexity rose 4.3% (0.3% with int8's; benchmarks/engine_speed.md, section 10).
"""
from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch

WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4", "auto", "w8a8")
INT4_GROUP = 32
"""Input columns per int4 group: GGUF's Q4_0/Q4_1 block size."""
INT4_COLUMNS = 16
"""The int4 kernel's output width must be a multiple of this."""
HEAD_FORMAT = {"bf16": "bf16", "int8": "int8", "int4": "int8", "auto": "int8", "w8a8": "w8a8"}
"""The output projection's format under each packed weight format ("int4" is measured by
benchmarks/engine_speed.py's ``auto/int4`` arms; it fails quality, see above)."""
DENSE_ROWS = 16
"""``auto``: rows from which a matmul runs bf16 dense rather than the int4 kernel
(benchmarks/engine_speed.md, section 4: where the two cross on this machine's CPU)."""


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """``x`` in bfloat16; one that is already costs no call (a step makes 100s of these)."""
    return x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)


def _in_dtype_of(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return y if y.dtype == x.dtype else y.to(x.dtype)


class PackedWeight(Protocol):
    """A projection kept in a packed form: ``mm(x)`` is ``x @ w`` for ``x`` [T, in]."""

    def mm(self, x: torch.Tensor) -> torch.Tensor: ...

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w`` as the kernel gives it, in bfloat16 (``mm`` casts it back to x's dtype).
        An in-place add into a float32 tensor takes it as is: bf16 widens to float32 exactly."""
        ...

    def dense(self) -> torch.Tensor:
        """The [in, out] float32 weight it stands for (tests, migration checks)."""
        ...

    @property
    def nbytes(self) -> int: ...


class Bf16Weight:
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w.to(torch.bfloat16).contiguous()  # [in, out]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}

    @classmethod
    def of(cls, t: dict[str, torch.Tensor]) -> Bf16Weight:
        self = cls.__new__(cls)
        self.w = t["w"]
        return self

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return _in_dtype_of(self.mm_bf16(x), x)

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        return _bf16(x) @ self.w

    def dense(self) -> torch.Tensor:
        return self.w.float()

    @property
    def nbytes(self) -> int:
        return self.w.numel() * 2


def _rowwise_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ([in, out]) as int8 rows of its transpose ([out, in]) and each row's float32
    scale (its largest magnitude over 127)."""
    wt = w.t().float().contiguous()
    scale = (wt.abs().amax(dim=1) / 127).clamp(min=1e-12).contiguous()
    return (wt / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous(), scale


class Int8Weight:
    """Symmetric per-output-channel int8: w[:, j] = q[j] * scale[j]."""

    def __init__(self, w: torch.Tensor) -> None:
        self.q, scale = _rowwise_int8(w)
        self.scale = scale.to(torch.bfloat16).contiguous()

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"q": self.q, "scale": self.scale}

    @classmethod
    def of(cls, t: dict[str, torch.Tensor]) -> Int8Weight:
        self = cls.__new__(cls)
        self.q, self.scale = t["q"], t["scale"]
        return self

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return _in_dtype_of(self.mm_bf16(x), x)

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch._weight_int8pack_mm(_bf16(x), self.q, self.scale)
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the [out, in] matrix, dequantized: the embedding of a tied head."""
        return self.q[ids].float() * self.scale[ids, None].float()

    def dense(self) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None].float()).t()

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 2


def _int4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [in, out] -> its integers q [out, in] in [0, 15] (int32) and the kernel's
    [in / group, out, 2] bf16 (scale, zero), zero = lo + 8 * scale: w = (q - 8) * scale + zero."""
    wt = w.t().float().contiguous()  # [out, in]
    n, k = wt.shape
    if k % INT4_GROUP:
        raise ValueError(f"int4 needs input width divisible by {INT4_GROUP}, got {k}")
    groups = wt.view(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((groups - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    sz = torch.stack([scale.t(), (lo + 8 * scale).t()], dim=-1).to(torch.bfloat16).contiguous()
    return q.view(n, k), sz


class Int4Weight:
    """Asymmetric int4 in groups of ``INT4_GROUP`` input columns, in the kernel's layout:
    w = (q - 8) * scale + zero, with q in [0, 15]."""

    def __init__(self, w: torch.Tensor) -> None:
        q, self.scales_zeros = _int4_groups(w)
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 2)

    @property
    def k(self) -> int:
        return int(self.scales_zeros.shape[0]) * INT4_GROUP

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"packed": self.packed, "scales_zeros": self.scales_zeros}

    @classmethod
    def of(cls, t: dict[str, torch.Tensor]) -> Int4Weight:
        self = cls.__new__(cls)
        self.packed, self.scales_zeros = t["packed"], t["scales_zeros"]
        return self

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return _in_dtype_of(self.mm_bf16(x), x)

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch._weight_int4pack_mm_for_cpu(_bf16(x), self.packed, INT4_GROUP,
                                                            self.scales_zeros)
        return y

    def dense(self) -> torch.Tensor:
        return self.mm(torch.eye(self.k))

    @property
    def nbytes(self) -> int:
        return int(self.packed.numel() * self.packed.element_size()) + self.scales_zeros.numel() * 2


REDUCE_RANGE = not getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
"""``w8a8`` quantizes activations to 7 bits where the CPU lacks VNNI: fbgemm's AVX2 path sums
pairs of u8 x s8 products in int16, which 8-bit activations could overflow."""


def _fbgemm_prepack(q: torch.Tensor, scale: torch.Tensor) -> Any:
    """int8 ``q`` [out, in] with its float32 per-row ``scale``, packed for fbgemm's int8 GEMM
    (chosen here, whatever ``torch.backends.quantized.engine`` says: oneDNN's was slower).
    torch 2.13 marks its quantized tensor types deprecated; the kernels stand, and the
    warning is this module's to track (benchmarks/engine_speed.md, section 12), not a
    user's to read at every start."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
        qt = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
    saved = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        return torch.ops.quantized.linear_prepack(qt, None)
    finally:
        torch.backends.quantized.engine = saved


class W8A8Weight:
    """``w8a8``: int8 weights per output channel, and activations quantized to 8 bits at
    each call, so fbgemm multiplies integers (VNNI dot products) and streams a byte a
    weight once for all rows: float32 in and out, no bfloat16 cast. A step of several
    rows is quantized row by row (each row divided by its own max |x| first, the product
    multiplied back): one token's outliers then cost no other token its precision, and a
    request's result hardly depends on who shares its step."""

    def __init__(self, w: torch.Tensor) -> None:
        self.q, self.scale = _rowwise_int8(w)
        self.packed = _fbgemm_prepack(self.q, self.scale)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"q": self.q, "scale": self.scale}

    @classmethod
    def of(cls, t: dict[str, torch.Tensor]) -> W8A8Weight:
        self = cls.__new__(cls)
        self.q, self.scale = t["q"], t["scale"]
        self.packed = _fbgemm_prepack(self.q, self.scale)
        return self

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            y: torch.Tensor = torch.ops.quantized.linear_dynamic(x, self.packed, REDUCE_RANGE)
            return y
        peak = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_(min=1e-30)
        y = torch.ops.quantized.linear_dynamic(x / peak, self.packed, REDUCE_RANGE)
        return y.mul_(peak)

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        """``mm``: this kernel's product is float32 already."""
        return self.mm(x)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids, None]

    def dense(self) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).t()

    @property
    def nbytes(self) -> int:
        """``q`` and fbgemm's packed copy of it (the cache's source, the kernel's operand)."""
        return self.q.numel() * 2 + self.scale.numel() * 4


class RowAwareWeight:
    """``auto``: the int4 kernel for fewer than ``DENSE_ROWS`` rows, a bf16 dense copy of
    the same weights for more (both resident: 0.625 + 2 bytes a weight)."""

    def __init__(self, w: torch.Tensor) -> None:
        q, sz = _int4_groups(w)
        self.int4 = Int4Weight.of({"packed": torch._convert_weight_to_int4pack_for_cpu(q, 2),
                                   "scales_zeros": sz})
        # The int4 weights themselves in bf16, so both kernels compute with one set of weights.
        g = sz.float().transpose(0, 1)  # [out, in / group, 2]
        n, k = q.shape
        dense = (q.view(n, -1, INT4_GROUP).float() - 8) * g[..., :1] + g[..., 1:]
        self.bf16 = Bf16Weight(dense.view(n, k).t())

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.int4.tensors() | self.bf16.tensors()

    @classmethod
    def of(cls, t: dict[str, torch.Tensor]) -> RowAwareWeight:
        self = cls.__new__(cls)
        self.int4, self.bf16 = Int4Weight.of(t), Bf16Weight.of(t)
        return self

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return _in_dtype_of(self.mm_bf16(x), x)

    def mm_bf16(self, x: torch.Tensor) -> torch.Tensor:
        return self.int4.mm_bf16(x) if x.shape[0] < DENSE_ROWS else self.bf16.mm_bf16(x)

    def dense(self) -> torch.Tensor:
        return self.bf16.dense()

    @property
    def nbytes(self) -> int:
        return self.int4.nbytes + self.bf16.nbytes


Weight = torch.Tensor | Bf16Weight | Int8Weight | Int4Weight | RowAwareWeight | W8A8Weight
PackedHead = Bf16Weight | Int8Weight | Int4Weight | W8A8Weight
HEADS: dict[str, type[PackedHead]] = {"bf16": Bf16Weight, "int8": Int8Weight, "int4": Int4Weight,
                                      "w8a8": W8A8Weight}
PACKED: dict[str, type[Bf16Weight | Int8Weight | Int4Weight | RowAwareWeight | W8A8Weight]] = {
    "bf16": Bf16Weight, "int8": Int8Weight, "int4": Int4Weight, "auto": RowAwareWeight, "w8a8": W8A8Weight}


def pack(w: torch.Tensor, fmt: str) -> Weight:
    """``w`` [in, out] float in ``fmt``; fp32 returns it unchanged."""
    if fmt == "fp32":
        return w
    if fmt in PACKED:
        return PACKED[fmt](w)
    raise ValueError(f"weight format must be one of {', '.join(WEIGHT_FORMATS)}, not {fmt!r}")


def pack_head(w: torch.Tensor, fmt: str) -> PackedHead:
    """The output projection ``w`` [hidden, vocab] packed for weight format ``fmt``. The int4
    kernel takes output widths in multiples of 16, so an int4 head of another vocabulary
    size gets zero columns up to one (its logits are sliced back to the vocabulary)."""
    head = HEAD_FORMAT[fmt]
    if head == "int4" and w.shape[1] % INT4_COLUMNS:
        w = torch.nn.functional.pad(w, (0, -w.shape[1] % INT4_COLUMNS))
    return HEADS[head](w)


def matmul(x: torch.Tensor, w: Weight) -> torch.Tensor:
    return x @ w if isinstance(w, torch.Tensor) else w.mm(x)


def matmul_f32(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``x @ w`` in float32 whatever ``x``'s dtype (a packed kernel's bfloat16 widened)."""
    return x @ w if isinstance(w, torch.Tensor) else w.mm_bf16(x).float()


def weight_bytes(w: Weight) -> int:
    return w.numel() * w.element_size() if isinstance(w, torch.Tensor) else w.nbytes


def check_cpu_format(fmt: str, device: str | torch.device, dtype: torch.dtype) -> None:
    """The packed formats run on CPU with float32 activations only."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format must be one of {', '.join(WEIGHT_FORMATS)}, not {fmt!r}")
    if fmt == "w8a8" and "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError("weight format w8a8 needs torch's fbgemm int8 kernels (an x86 CPU build)")
    if fmt != "fp32" and (torch.device(device).type != "cpu" or dtype != torch.float32):
        raise ValueError(f"weight format {fmt} needs device cpu and dtype float32 "
                         f"(got {device}, {str(dtype).removeprefix('torch.')})")
