"""A small, committed summary of a raw result file too large for git (over 1 MB).

    .venv/bin/python benchmarks/summarize.py benchmarks/results/gpu/migration-cuda.json

writes ``migration-cuda-summary.json`` beside the raw file: for ``llumnix bench migration``
results every figure but the per-step logs of each migration (``src_steps``, ``dst_steps``);
for the fidelity study (``python -m benchmarks.fidelity``) its reports, noise floor and a
line per real run. ``--regenerate`` records the command that rewrites the raw file. The
raw names are git-ignored (.gitignore); the summaries are what docs quote.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

STEP_LOGS = ("src_steps", "dst_steps")


def summarize_migration(doc: dict[str, Any]) -> dict[str, Any]:
    rows = [{k: v for k, v in row.items() if k not in STEP_LOGS} for row in doc["rows"]]
    return {**doc, "rows": rows, "dropped": {"rows": list(STEP_LOGS)}}


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("benchmark") == "migration":
        return summarize_migration(doc)
    if "reports" in doc and "noise_floor" in doc:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.fidelity.run import summarize as summarize_fidelity

        return summarize_fidelity(doc)
    raise SystemExit("summarize: neither a `llumnix bench migration` result nor a fidelity study's")


def summary_path(raw: Path) -> Path:
    return raw.with_name(f"{raw.stem}-summary.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw", type=Path, help="the raw result JSON")
    p.add_argument("--regenerate", default=None, help="the command that rewrites the raw file")
    args = p.parse_args(argv)
    summary = summarize(json.loads(args.raw.read_text()))
    summary["raw_file"] = {"name": args.raw.name, "bytes": args.raw.stat().st_size, "committed": False}
    if args.regenerate:
        summary["regenerate"] = args.regenerate
    out = summary_path(args.raw)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
