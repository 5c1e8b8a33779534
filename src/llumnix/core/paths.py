"""Where Llumnix keeps what it can rebuild (tokenized datasets, dequantized weights)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$LLUMNIX_CACHE``, else ``~/.cache/llumnix``."""
    return Path(os.environ.get("LLUMNIX_CACHE", Path.home() / ".cache" / "llumnix"))
