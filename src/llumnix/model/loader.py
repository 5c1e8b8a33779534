"""Resolve a model spec ('smollm2', a .gguf file, an HF directory) and load it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from llumnix.config.model_path import SMOLLM2_FILE
from llumnix.config.model_path import resolve_model_path as resolve_model_path  # re-exported, as before
from llumnix.config.model_path import smollm2_path as smollm2_path
from llumnix.core.errors import ModelLoadError
from llumnix.model.config import LlamaConfig
from llumnix.model.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch only where weights load: a gateway loads the tokenizer alone
    import torch

    from llumnix.model.llama import LlamaModel


@dataclass
class LoadedModel:
    name: str
    path: Path
    config: LlamaConfig
    model: LlamaModel
    tokenizer: Tokenizer


def load_model(spec: str = "smollm2", device: str = "cpu", dtype: str | torch.dtype = "float32",
               weight_format: str = "fp32") -> LoadedModel:
    """``weight_format`` (``quant.WEIGHT_FORMATS``): the projections packed for CPU
    weight-only kernels after loading; fp32 keeps them as loaded (the exact path)."""
    from llumnix.model.executor import resolve_dtype
    from llumnix.model.quant import check_cpu_format

    path = resolve_model_path(spec)
    torch_dtype = resolve_dtype(dtype)
    try:
        check_cpu_format(weight_format, device, torch_dtype)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    if path.is_dir():
        from llumnix.model.hf_loader import load_hf_dir

        config, model = load_hf_dir(path, device, torch_dtype)
        tokenizer = Tokenizer.from_dir(path, config.bos_token_id, config.eos_token_id)
        name = path.name
    elif path.suffix == ".gguf":
        from llumnix.model.gguf_file import read_fields
        from llumnix.model.gguf_loader import load_gguf

        config, model, reader = load_gguf(path, device, torch_dtype, weight_format)
        tokenizer = Tokenizer.from_gguf(reader, read_fields(reader))
        name = "smollm2" if path.name == SMOLLM2_FILE else path.stem
    else:
        raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face directory")
    model.pack_weights(weight_format)
    _release_free_heap()
    return LoadedModel(name=name, path=path, config=config, model=model, tokenizer=tokenizer)


def load_tokenizer(spec: str = "smollm2", chat_template: str | None = None) -> Tokenizer:
    """The model's tokenizer alone, without its weights (what a gateway needs); with
    ``chat_template``, that Jinja template instead of the model's."""
    tokenizer = _load_tokenizer(spec)
    if chat_template is None:
        return tokenizer
    try:
        return tokenizer.with_chat_template(chat_template)
    except jinja2.TemplateError as e:
        raise ModelLoadError(f"the chat template is not valid Jinja: {' '.join(str(e).split())}") from None


def _load_tokenizer(spec: str) -> Tokenizer:
    path = resolve_model_path(spec)
    if path.is_dir():
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot read config.json: {e}") from e
        config = LlamaConfig.from_hf(raw)
        return Tokenizer.from_dir(path, config.bos_token_id, config.eos_token_id)
    if path.suffix == ".gguf":
        from llumnix.model.gguf_file import GGUFFile, read_fields

        try:
            reader = GGUFFile(path)
        except Exception as e:  # noqa: BLE001 - report any parse failure as a load error
            raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from e
        return Tokenizer.from_gguf(reader, read_fields(reader))
    raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face directory")


def _release_free_heap() -> None:
    """Dequantizing leaves freed buffers in glibc's heap; hand them back to the OS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim
