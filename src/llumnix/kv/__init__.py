"""Paged KV block accounting (pure Python; the tensors live in model/)."""
from llumnix.kv.block_pool import BlockPool
from llumnix.kv.kv_manager import KVManager

__all__ = ["BlockPool", "KVManager"]
