"""The model: the only package that imports torch. Its names load on first use, so a
process that needs only the tokenizer (a gateway: ``load_tokenizer``) never imports torch."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llumnix.model.config import LlamaConfig
    from llumnix.model.executor import ModelExecutor, bytes_per_block, num_blocks_for_bytes, resolve_dtype
    from llumnix.model.llama import LlamaModel
    from llumnix.model.loader import LoadedModel, load_model, load_tokenizer, resolve_model_path, smollm2_path
    from llumnix.model.tokenizer import Tokenizer

_MODULES = {"LlamaConfig": "config", "ModelExecutor": "executor", "bytes_per_block": "executor",
            "num_blocks_for_bytes": "executor", "resolve_dtype": "executor", "LlamaModel": "llama",
            "LoadedModel": "loader", "load_model": "loader", "load_tokenizer": "loader",
            "resolve_model_path": "loader", "smollm2_path": "loader", "Tokenizer": "tokenizer"}

__all__ = ["LlamaConfig", "LlamaModel", "LoadedModel", "ModelExecutor", "Tokenizer", "bytes_per_block",
           "load_model", "load_tokenizer", "num_blocks_for_bytes", "resolve_dtype", "resolve_model_path", "smollm2_path"]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"llumnix.model.{_MODULES[name]}"), name)
