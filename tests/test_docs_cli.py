"""The docs and the CLI agree: every subcommand (and benchmark) docs/serving.md and the
README name exists in the parser and every one the parser has is documented; every flag
of serve's table exists and every serve flag is in the table."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from llumnix.cli import _subcommands, build_parser

ROOT = Path(__file__).resolve().parents[1]
SERVING = (ROOT / "docs" / "serving.md").read_text()
README = (ROOT / "README.md").read_text()


def bench_choices() -> set[str]:
    bench = _subcommands(build_parser())["bench"]
    action = next(a for a in bench._actions if a.dest == "what")
    return set(action.choices or ())


def documented_commands(text: str) -> set[str]:
    """What follows `llumnix ` in commands and prose (``llumnix.`` module paths are not)."""
    return set(re.findall(r"\bllumnix ([a-z]+)\b", text))


def documented_benchmarks(text: str) -> set[str]:
    out: set[str] = set()
    for group in re.findall(r"llumnix bench \{([a-z,]+)\}", text):
        out |= set(group.split(","))
    out |= set(re.findall(r"llumnix bench ([a-z]+)\b", text))
    return out


def test_every_documented_subcommand_exists_and_every_subcommand_is_documented():
    parser = set(_subcommands(build_parser()))
    for name, text in (("docs/serving.md", SERVING), ("README.md", README)):
        assert documented_commands(text) - parser == set(), f"{name} documents commands the CLI lacks"
    assert parser - documented_commands(SERVING) == set(), "docs/serving.md misses commands"


def test_every_documented_benchmark_exists_and_every_benchmark_is_documented():
    for name, text in (("docs/serving.md", SERVING), ("README.md", README)):
        documented = documented_benchmarks(text)
        assert documented - bench_choices() == set(), f"{name} documents benchmarks the CLI lacks"
        assert bench_choices() - documented == set(), f"{name} misses benchmarks"


def serve_table() -> str:
    start = SERVING.index("## `llumnix serve` flags")
    return SERVING[start:SERVING.index("\n## ", start + 1)]


def table_flags() -> set[str]:
    out = set()
    for token in re.findall(r"`(-[^`]*)`", serve_table()):
        for flag in re.findall(r"(--?(?:\[no-\])?[a-zA-Z][a-z0-9-]*)", token):
            out |= {flag.replace("[no-]", ""), flag.replace("[no-]", "no-")} if "[no-]" in flag else {flag}
    return out


def test_every_flag_in_serves_table_exists_and_every_serve_flag_is_in_it():
    serve = _subcommands(build_parser())["serve"]
    visible = {o for a in serve._actions if a.help is not argparse.SUPPRESS for o in a.option_strings} - {"-h", "--help"}
    hidden = {o for a in serve._actions if a.help is argparse.SUPPRESS for o in a.option_strings}
    documented = table_flags() - {"--help"}
    assert documented - visible - hidden == set(), "serve's table documents flags the CLI lacks"
    assert visible - documented == set(), "serve's table misses flags"
    assert hidden - documented == set(), "the vLLM flags serve refuses or ignores are not all listed"
