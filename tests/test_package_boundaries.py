"""The pure packages (shared with the simulator) never import torch or ray."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "llumnix"
PURE = ["core", "kv", "engine", "policy", "migration/protocol.py"]
FORBIDDEN = {"torch", "ray"}


def _pure_files() -> list[Path]:
    files: list[Path] = []
    for name in PURE:
        p = SRC / name
        files += [p] if p.is_file() else sorted(p.rglob("*.py"))
    return files


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_pure_sources_have_no_forbidden_import_statements():
    files = _pure_files()
    assert len(files) >= 8, "the pure packages went missing"
    bad = {str(f.relative_to(SRC)): sorted(_imported_roots(f) & FORBIDDEN) for f in files}
    assert not {k: v for k, v in bad.items() if v}


def test_importing_pure_packages_loads_neither_torch_nor_ray():
    mods = [str(f.relative_to(SRC.parent)).removesuffix(".py").replace("/", ".")
            for f in _pure_files()]
    mods = [m.removesuffix(".__init__") for m in mods]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in mods)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'ray'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
