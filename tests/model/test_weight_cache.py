"""The dequantized-weight cache: a second load maps the first one's tensors, bit for bit;
a changed source, a damaged file or LLUMNIX_WEIGHT_CACHE=0 never serve stale weights."""
from __future__ import annotations

import os

import pytest
import torch

from llumnix.model import weight_cache


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLUMNIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(weight_cache.ENV_OFF, raising=False)
    return tmp_path / "cache"


@pytest.fixture()
def source(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"GGUF" + bytes(60))
    return p


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"layers.0.wqkv": torch.randn(8, 24, generator=g), "norm": torch.randn(8, generator=g),
            "lm_head": torch.randn(8, 5, generator=g).t()}  # not contiguous: stored as such


def test_round_trip_bit_for_bit(cache, source):
    w = tensors()
    path = weight_cache.save(source, torch.float32, w)
    assert path is not None and path.parent == cache / "weights"
    back = weight_cache.load(source, torch.float32)
    assert back is not None and set(back) == set(w)
    assert all(torch.equal(back[k], w[k]) for k in w)


def test_another_dtype_or_a_changed_source_is_a_miss(cache, source):
    weight_cache.save(source, torch.float32, tensors())
    assert weight_cache.load(source, torch.bfloat16) is None
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the file was replaced
    assert weight_cache.load(source, torch.float32) is None


def test_a_packed_cache_from_another_kind_of_cpu_is_a_miss(cache, source, monkeypatch):
    """int4 packing is laid out per CPU capability (AVX2 and AVX-512 differ): a cache on a
    home shared by two kinds of machine must not hand one the other's packed weights."""
    weight_cache.save(source, torch.float32, tensors(), "int4")
    assert weight_cache.load(source, torch.float32, "int4") is not None
    other = "AVX2" if torch.backends.cpu.get_cpu_capability() != "AVX2" else "AVX512"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    assert weight_cache.load(source, torch.float32, "int4") is None


def test_a_w8a8_cache_of_another_smoothing_is_a_miss(cache, source, monkeypatch):
    """w8a8's int8 weights carry SmoothQuant's factors: weights smoothed with another
    strength are other weights, never served for these."""
    from llumnix.model import smooth

    weight_cache.save(source, torch.float32, tensors(), "w8a8")
    weight_cache.save(source, torch.float32, tensors(), "int4")
    assert weight_cache.load(source, torch.float32, "w8a8") is not None
    monkeypatch.setattr(smooth, "ALPHA", smooth.ALPHA + 0.1)
    assert weight_cache.load(source, torch.float32, "w8a8") is None
    assert weight_cache.load(source, torch.float32, "int4") is not None


def test_off_by_environment(cache, source, monkeypatch):
    monkeypatch.setenv(weight_cache.ENV_OFF, "0")
    assert weight_cache.save(source, torch.float32, tensors()) is None
    assert not cache.exists()
    assert weight_cache.load(source, torch.float32) is None


def test_a_damaged_file_is_a_miss(cache, source, caplog):
    path = weight_cache.save(source, torch.float32, tensors())
    assert path is not None
    path.write_bytes(path.read_bytes()[:40])
    assert weight_cache.load(source, torch.float32) is None
    assert "unreadable" in caplog.text


def test_an_unwritable_cache_is_skipped(tmp_path, source, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LLUMNIX_CACHE", str(blocker))
    assert weight_cache.save(source, torch.float32, tensors()) is None


def test_smollm2_second_load_comes_from_the_cache(cache, monkeypatch):
    from llumnix.model import gguf_loader
    from llumnix.model.loader import load_model

    first = load_model("smollm2")
    assert len(list((cache / "weights").glob("*.safetensors"))) == 1

    def no_dequantizing(*_: object) -> None:
        raise AssertionError("a cached load must not dequantize")

    monkeypatch.setattr(gguf_loader, "_weights", no_dequantizing)
    second = load_model("smollm2")
    for a, b in zip(first.model.layers, second.model.layers, strict=True):
        assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in gguf_loader.LAYER_FIELDS)
    assert torch.equal(first.model.norm, second.model.norm)
    heads = [m.model._panels if m.model._panels is not None else m.model._head for m in (first, second)]
    assert heads[0] is not None and torch.equal(heads[0], heads[1])  # the tied embedding and output head


@pytest.mark.parametrize("fmt", ["int4", "auto", "w8a8"])
def test_a_packed_format_is_cached_packed(cache, monkeypatch, fmt):
    """A packed start after the first maps the packed tensors: neither dequantizes nor
    packs (nor, for w8a8, calibrates), and computes what the first computed, bit for bit."""
    from llumnix.model import gguf_loader, quant, smooth
    from llumnix.model.loader import load_model

    first = load_model("smollm2", weight_format=fmt)
    names = sorted(p.name for p in (cache / "weights").glob("*.safetensors"))
    assert len(names) == 2 and sum(f"-{fmt}-" in n for n in names) == 1  # the float tensors and the packed ones

    def no_work(*_: object) -> None:
        raise AssertionError("a cached packed load must neither dequantize nor pack")

    monkeypatch.setattr(gguf_loader, "_weights", no_work)
    monkeypatch.setattr(quant, "_int4_groups", no_work)
    monkeypatch.setattr(smooth, "activation_maxima", no_work)
    second = load_model("smollm2", weight_format=fmt)
    assert second.model.weight_format == fmt
    a, b = gguf_loader.packed_tensors(first.model), gguf_loader.packed_tensors(second.model)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(3, first.config.hidden_size)
    for lw1, lw2 in zip(first.model.layers[:2], second.model.layers[:2], strict=True):
        assert torch.equal(quant.matmul(x, lw1.w_gate_up), quant.matmul(x, lw2.w_gate_up))
    assert torch.equal(first.model.logits(x), second.model.logits(x))
    ids = torch.tensor([0, 17, first.config.vocab_size - 1])  # the tied embedding's rows
    assert torch.equal(first.model.embed_tokens(ids), second.model.embed_tokens(ids))
