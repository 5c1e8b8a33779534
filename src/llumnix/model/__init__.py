"""The model: the only package that imports torch."""
from llumnix.model.config import LlamaConfig
from llumnix.model.executor import ModelExecutor, bytes_per_block, num_blocks_for_bytes, resolve_dtype
from llumnix.model.llama import LlamaModel
from llumnix.model.loader import LoadedModel, load_model, load_tokenizer, resolve_model_path, smollm2_path
from llumnix.model.tokenizer import Tokenizer

__all__ = ["LlamaConfig", "LlamaModel", "LoadedModel", "ModelExecutor", "Tokenizer", "bytes_per_block",
           "load_model", "load_tokenizer", "num_blocks_for_bytes", "resolve_dtype", "resolve_model_path", "smollm2_path"]
