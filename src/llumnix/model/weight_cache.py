"""A GGUF's weights as the model uses them (dequantized, Q/K unpermuted, fused, laid
out), kept on disk: every start after the first (a restart, a lost instance's
replacement, an auto-scaling scale-out) maps them instead of dequantizing again
(SmolLM2: 2.6 s -> 0.3 s a load here).

    key    the GGUF's resolved path, size and modification time, the dtype, ``LAYOUT``
           (bumped whenever the loader's layout changes); for a packed weight format
           (``quant.WEIGHT_FORMATS``) the format, its head's (``quant.HEAD_FORMAT``) and
           torch's version and the CPU's vector capability too (the int4 kernel's packing
           is torch's own layout, and differs between AVX2 and AVX-512: a cache on a home
           shared by two kinds of machine must not hand one the other's packing), so a
           packed start neither dequantizes nor packs again (SmolLM2 int4: 7-9 s -> what
           fp32 takes); for w8a8 SmoothQuant's settings as well (its weights carry the factors)
    file   ``$LLUMNIX_CACHE/weights/<key>.safetensors`` (default ``~/.cache/llumnix``),
           written under a temporary name and renamed, so a reader never sees half a
           file; read through a memory map, so instances on one node share its pages
    off    ``LLUMNIX_WEIGHT_CACHE=0``; a cache that cannot be written (disk full, a
           read-only home) is skipped with one log line, never an error
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

from llumnix.core.paths import cache_dir
from llumnix.model.quant import HEAD_FORMAT

log = logging.getLogger(__name__)

LAYOUT = 1
"""Bump when what ``gguf_loader`` stores changes meaning: older files are then ignored."""
ENV_OFF = "LLUMNIX_WEIGHT_CACHE"


def enabled() -> bool:
    return os.environ.get(ENV_OFF, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_path(source: Path, dtype: torch.dtype, fmt: str = "fp32") -> Path:
    st = source.stat()
    key = f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{LAYOUT}"
    name = source.stem
    if fmt != "fp32":
        key += f"|{fmt}|head {HEAD_FORMAT[fmt]}|torch {torch.__version__}|cpu {torch.backends.cpu.get_cpu_capability()}"
        name += f"-{fmt}"
    if "w8a8" in (fmt, HEAD_FORMAT.get(fmt)):  # its int8 weights carry SmoothQuant's factors
        from llumnix.model.smooth import ALPHA, CALIBRATION_TOKENS

        key += f"|smoothquant alpha {ALPHA} on {CALIBRATION_TOKENS} seeded ids"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_dir() / "weights" / f"{name}-{digest}.safetensors"


def load(source: Path, dtype: torch.dtype, fmt: str = "fp32") -> dict[str, torch.Tensor] | None:
    """The cached tensors (on CPU, memory-mapped), or None: not cached, off, or unreadable."""
    if not enabled():
        return None
    path = cache_path(source, dtype, fmt)
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:  # noqa: BLE001 - a damaged file is a miss; the load rebuilds it
        log.warning("weight cache %s unreadable (%s); loading %s again", path, e, source.name)
        return None


def save(source: Path, dtype: torch.dtype, tensors: dict[str, torch.Tensor], fmt: str = "fp32") -> Path | None:
    """Write ``tensors`` for ``source`` (returns the file, or None where it was not written)."""
    if not enabled():
        return None
    from safetensors.torch import save_file

    path = cache_path(source, dtype, fmt)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(path.parent).free < 2 * size:
            log.info("weight cache skipped: less than %d MiB free in %s", 2 * size >> 20, path.parent)
            return None
        save_file({k: t.contiguous() for k, t in tensors.items()}, tmp)
        os.replace(tmp, path)
    except OSError as e:
        log.info("weight cache not written (%s): %s", path.parent, e.strerror or e)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return path
