"""The engine core: local scheduler + KV manager + an executor (pure Python)."""
from llumnix.engine.engine_core import EngineCore
from llumnix.engine.scheduler import LocalScheduler

__all__ = ["EngineCore", "LocalScheduler"]
