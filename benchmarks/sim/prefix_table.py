"""The table of `prefix.yaml`'s runs: per trace, rate and system, seed means of the
prefix-cache hit rate, TTFT (mean, P99), decode per token (mean, P99), end-to-end mean,
preemptions, migrations, and the KV blocks migrations sent and adopted from their
destinations' caches.

    .venv/bin/python benchmarks/sim/prefix_table.py [benchmarks/sim/results/prefix/metrics.json]
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

COLUMNS = (
    ("hit rate", lambda r: r["prefix_cache"]["hit_rate"], "{:.2f}"),
    ("TTFT mean (s)", lambda r: r["prefill"]["mean"], "{:.3f}"),
    ("TTFT P99 (s)", lambda r: r["prefill"]["p99"], "{:.2f}"),
    ("decode mean (s)", lambda r: r["decode"]["mean"], "{:.4f}"),
    ("decode P99 (s)", lambda r: r["decode"]["p99"], "{:.4f}"),
    ("e2e mean (s)", lambda r: r["e2e"]["mean"], "{:.2f}"),
    ("preemptions", lambda r: r["num_preemptions"], "{:.0f}"),
    ("migrations", lambda r: r["migrations"]["num_committed"], "{:.0f}"),
    ("blocks sent", lambda r: r["migrations"]["num_blocks"], "{:.0f}"),
    ("blocks adopted", lambda r: r["migrations"].get("num_blocks_cached", 0), "{:.0f}"),
)


def table(records: list[dict[str, Any]]) -> str:
    runs: dict[tuple[str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        runs[(r["trace"], r["rate"], r["system"])].append(r)
    head = "| trace | rate | system | seeds | " + " | ".join(c for c, _, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COLUMNS))]
    for (trace, rate, system), rs in sorted(runs.items()):
        cells = [fmt.format(statistics.mean(get(r) for r in rs)) for _, get, fmt in COLUMNS]
        lines.append(f"| {trace} | {rate:g} | {system} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/sim/results/prefix/metrics.json")
    print(table(json.loads(path.read_text())["records"]))
