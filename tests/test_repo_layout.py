"""Product and study apart: study code under benchmarks/ uses only public llumnix names,
and git holds small summaries, not raw results (STYLE.md, habit 14)."""
from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_TRACKED_BYTES = 1_000_000


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _up_to_private(parts: list[str]) -> str | None:
    """``a.b._c.d`` -> ``a.b._c``; None where no part is private."""
    for i, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[:i + 1])
    return None


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_llumnix_imports(source: str) -> list[str]:
    """Private llumnix names a module imports (``from llumnix.x import _y``, ``import
    llumnix._x``, ``from llumnix._x import y``) or reaches through a llumnix module it
    imported (``llumnix.x._y``, ``from llumnix.model import llama`` then ``llama._y``)."""
    found: set[str | None] = set()
    modules = {"llumnix": "llumnix"}  # local name -> llumnix dotted path
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "llumnix":
            for a in node.names:
                found.add(_up_to_private([*node.module.split("."), a.name]))
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "llumnix":
                    found.add(_up_to_private(a.name.split(".")))
                    if a.asname:
                        modules[a.asname] = a.name
                    # a plain `import llumnix.x.y` binds `llumnix`, already known
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (parts := _dotted(node)) and parts[0] in modules:
            found.add(_up_to_private([*modules[parts[0]].split("."), *parts[1:]]))
    return sorted(name for name in found if name)


def test_the_check_catches_each_form():
    assert private_llumnix_imports("from llumnix.bench.profile import _drain, synthetic_prompt") == [
        "llumnix.bench.profile._drain"]
    assert private_llumnix_imports("from llumnix.model._impl import x\nimport llumnix.sim._hidden") == [
        "llumnix.model._impl", "llumnix.sim._hidden"]
    assert private_llumnix_imports("import llumnix.model.llama\ny = llumnix.model.llama._to_panels(w)") == [
        "llumnix.model.llama._to_panels"]
    assert private_llumnix_imports("from llumnix.model import llama as L\ny = L._to_panels(w)") == [
        "llumnix.model.llama._to_panels"]
    # an object's own attributes are not names of a llumnix module
    assert private_llumnix_imports("from llumnix.llm import LLM\nm = LLM('x').loaded.model._panels") == []
    assert private_llumnix_imports("from llumnix.sim.report import format_number\nimport llumnix\n"
                                   "from benchmarks.x import _local\nv = llumnix.__version__") == []


def test_study_code_imports_only_public_llumnix_names():
    offenders = {str(p.relative_to(ROOT)): names for p in sorted((ROOT / "benchmarks").rglob("*.py"))
                 if (names := private_llumnix_imports(p.read_text()))}
    assert not offenders, f"make these public in src/ or copy the logic locally: {offenders}"


def test_no_tracked_file_is_over_1_mb():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    sizes = {name: (ROOT / name).stat().st_size for name in tracked.decode().split("\0")
             if name and (ROOT / name).is_file()}
    big = {name: size for name, size in sizes.items() if size > MAX_TRACKED_BYTES}
    assert not big, (f"commit a summary instead (benchmarks/summarize.py) and git-ignore the raw file: {big}")


MAX_FUNCTION_LINES = 80
"""Issue 29's limit on any function in src/ (aim for about 60; STYLE.md, habit 1)."""


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of each function, method or nested function over ``limit``
    lines, decorators left out."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and child.end_lineno is not None:
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found.append((name, lines))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_length_check_counts_nested_functions_and_methods():
    src = ("def a():\n    x = 1\n    def b():\n        y = 2\n        return y\n    return b\n"
           "class C:\n    def m(self):\n        z = 3\n        return z\n")
    assert long_functions(src, limit=2) == [("a", 6), ("a.b", 3), ("C.m", 3)]
    assert long_functions(src, limit=3) == [("a", 6)]
    assert long_functions(src, limit=6) == []


def test_no_function_in_src_is_over_80_lines():
    offenders = {f"{p.relative_to(ROOT)}::{name}": n for p in sorted((ROOT / "src").rglob("*.py"))
                 for name, n in long_functions(p.read_text())}
    assert not offenders, f"split these (issue 29: at most {MAX_FUNCTION_LINES} lines): {offenders}"


MAX_CLASS_LINES = 400
"""Issue 44's limit on any class in src/: a room a new engineer can find their way in."""


def long_classes(source: str, limit: int = MAX_CLASS_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of each class, nested ones included, over ``limit`` lines."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if (isinstance(child, ast.ClassDef) and child.end_lineno is not None
                    and (lines := child.end_lineno - child.lineno + 1) > limit):
                found.append((name, lines))
            visit(child, f"{name}." if isinstance(child, (ast.ClassDef, ast.FunctionDef)) else prefix)

    visit(ast.parse(source), "")
    return found


def test_the_class_check_counts_nested_classes():
    src = "class A:\n    x = 1\n    class B:\n        y = 2\n\n\nclass C:\n    pass\n"
    assert long_classes(src, limit=2) == [("A", 4)]
    assert long_classes(src, limit=1) == [("A", 4), ("A.B", 2), ("C", 2)]
    assert long_classes(src, limit=4) == []


def test_no_class_in_src_is_over_400_lines():
    offenders = {f"{p.relative_to(ROOT)}::{name}": n for p in sorted((ROOT / "src").rglob("*.py"))
                 for name, n in long_classes(p.read_text())}
    assert not offenders, f"split these by role (issue 44: at most {MAX_CLASS_LINES} lines): {offenders}"


def test_the_gateway_app_and_the_readme_stay_small():
    """Issue 29's front door: build_app in modules, a README a new user reads in minutes."""
    app_lines = len((ROOT / "src/llumnix/gateway/app.py").read_text().splitlines())
    assert app_lines <= 200, f"gateway/app.py has {app_lines} lines (at most 200)"
    words = len((ROOT / "README.md").read_text().split())
    assert words <= 1200, f"README.md has {words} words (at most 1,200)"
