"""A GGUF file's metadata and tensors, read in a fraction of a second.

``gguf.GGUFReader`` builds a numpy memmap view for every part of every field: SmolLM2's
49,152 tokens and 48,900 merges take it 3-8 s on this CPU, in the gateway and again in
every instance. This reader walks the same layout with ``struct`` (the format: magic,
version, counts; key/value fields; tensor infos; aligned data) and offers the subset of
``GGUFReader``'s interface the loaders use: ``fields[key].contents()`` and ``tensors``
with ``name``, ``shape``, ``tensor_type`` and ``data``.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llumnix.core.errors import ModelLoadError

_MAGIC = 0x46554747  # "GGUF", little-endian
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Field:
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: np.ndarray
    """Dimensions in GGUF's order (the fastest-varying first), as ``GGUFReader`` gives them."""
    tensor_type: Any
    """A ``gguf.GGMLQuantizationType``."""
    data: np.ndarray
    """Read-only: float elements for F32/F16/BF16 tensors, else the raw block bytes, shaped
    as ``GGUFReader`` shapes them."""


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as f:
            try:
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                raise ModelLoadError("GGUF magic invalid (empty file)") from None
        self._pos = 0
        if len(self._buf) < 24 or self._read("<I") != _MAGIC:
            raise ModelLoadError("GGUF magic invalid")
        version = self._read("<I")
        if version < 2:
            raise ModelLoadError(f"GGUF version {version} is not supported (2 or 3)")
        num_tensors, num_fields = self._read("<Q"), self._read("<Q")
        self.fields: dict[str, Field] = {}
        for _ in range(num_fields):
            key = self._string()
            self.fields[key] = Field(self._value(self._read("<I")))
        infos = [self._tensor_info() for _ in range(num_tensors)]
        align = int(self.fields["general.alignment"].value) if "general.alignment" in self.fields else 32
        start = -(-self._pos // align) * align
        data = np.frombuffer(self._buf, dtype=np.uint8)
        self.tensors = [self._tensor(data, start, *info) for info in infos]

    def _read(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        text = self._buf[self._pos:self._pos + n].decode("utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._read("<I"), self._read("<Q")
            if item == _STRING:
                return [self._string() for _ in range(count)]
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[item])
                values = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
                self._pos += count * dtype.itemsize
                return values.tolist()
            return [self._value(item) for _ in range(count)]  # arrays of arrays
        if kind not in _SCALARS:
            raise ModelLoadError(f"GGUF value type {kind} is unknown")
        return self._read(_SCALARS[kind])

    def _tensor_info(self) -> tuple[str, list[int], int, int]:
        name = self._string()
        dims = [self._read("<Q") for _ in range(self._read("<I"))]
        return name, dims, self._read("<I"), self._read("<Q")

    @staticmethod
    def _tensor(data: np.ndarray, start: int, name: str, dims: list[int], kind: int, offset: int) -> Tensor:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        qtype = GGMLQuantizationType(kind)
        shape = tuple(reversed(dims))
        floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
        if qtype in floats:
            dtype = np.dtype(floats[qtype])
            n = int(np.prod(shape))
            arr = data[start + offset:start + offset + n * dtype.itemsize].view(dtype).reshape(shape)
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(shape)) // block * size
            arr = data[start + offset:start + offset + n].reshape(quant_shape_to_byte_shape(shape, qtype))
        return Tensor(name, np.array(dims, dtype=np.uint64), qtype, arr)


def dequantize(data: np.ndarray, qtype: Any) -> np.ndarray:
    """``gguf.quants.dequantize`` (bit for bit), whole tensors at once for the types of
    SmolLM2's file (Q8_0, Q4_1), twice as fast as gguf's row groups; others through gguf."""
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import dequantize as gguf_dequantize

    if qtype == Q.Q8_0:  # per 32 values: f16 scale, 32 x int8
        b = data.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        return (d * b[:, 2:].view(np.int8).astype(np.float32)).reshape(*data.shape[:-1], -1)
    if qtype == Q.Q4_1:  # per 32 values: f16 scale, f16 min, 16 bytes of nibbles (low ones first)
        b = data.reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = b[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (d * q + m).reshape(*data.shape[:-1], -1)
    return np.asarray(gguf_dequantize(data, qtype))


def read_fields(reader: Any) -> dict[str, Any]:
    """Every field's value but the tokenizer's large arrays, and the set of tensor names."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type")):
            continue  # large arrays: read by the tokenizer loader
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - a field type gguf cannot decode is not one we use
            continue
    out["_tensor_names"] = {t.name for t in reader.tensors}
    return out
