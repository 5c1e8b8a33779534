"""The table of `beyond.md`'s chunked-prefill section: each system with and without
chunked prefill at Figure 11's load-matched lowest and top rates (seed means, seeds 0-2).

    .venv/bin/python benchmarks/sim/chunked_table.py [RESULTS]   (default chunked: the 512-token
    budget; chunked-2048: the same runs at 2,048 tokens a step)
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
UNCHUNKED = ("figure11-matched", "figure11-matched-low-seeds", "figure11-matched-top-seeds")
METRICS = (("prefill", "p99", "P99 prefill"), ("prefill", "mean", "mean prefill"),
           ("decode", "p99", "P99 decode"), ("decode", "mean", "mean decode"), ("e2e", "mean", "mean e2e"))


def load(name: str) -> list[dict]:
    records: list[dict] = json.loads((RESULTS / name / "metrics.json").read_text())["records"]
    return records


def key(r: dict) -> tuple[str, str, float, int]:
    return (r["system"], r["trace"], float(r["rate"]), int(r["seed"]))


def main() -> None:
    chunked = {key(r): r for r in load(sys.argv[1] if len(sys.argv) > 1 else "chunked")}
    plain = {key(r): r for name in UNCHUNKED for r in load(name) if key(r) in chunked}
    points = sorted({k[:3] for k in chunked}, key=lambda k: (k[1], k[2], k[0]))
    head = " | ".join(f"{label} (chunked / not)" for _, _, label in METRICS)
    print(f"| trace | rate | system | {head} | preemption loss (s, chunked / not) |")
    print("|---" * (4 + len(METRICS)) + "|")
    wins = {label: [0, 0] for _, _, label in METRICS}
    for system, trace, rate in points:
        seeds = sorted(s for (sy, tr, ra, s) in chunked if (sy, tr, ra) == (system, trace, rate)
                       and (sy, tr, ra, s) in plain)
        if not seeds:
            continue
        cells = []
        for part, stat, label in METRICS:
            c = statistics.fmean(chunked[(system, trace, rate, s)][part][stat] for s in seeds)
            p = statistics.fmean(plain[(system, trace, rate, s)][part][stat] for s in seeds)
            wins[label][0] += c < p
            wins[label][1] += 1
            cells.append(f"{c:.3g} / {p:.3g} ({c / p:.2f}x)")
        loss = [statistics.fmean(src[(system, trace, rate, s)]["preemption_loss"]["mean"] for s in seeds)
                for src in (chunked, plain)]
        print(f"| {trace} | {rate:g} | {system} | {' | '.join(cells)} | {loss[0]:.3g} / {loss[1]:.3g} |")
    print()
    print("Points where chunked is lower (seed means): "
          + ", ".join(f"{label} {w}/{n}" for label, (w, n) in wins.items()))
    print()
    print("INFaaS++ / Llumnix (seed means; above 1: Llumnix better), with and without chunked prefill:")
    print()
    print("| trace | rate | P99 prefill chunked | P99 prefill not | P99 decode chunked | P99 decode not |")
    print("|---|---|---|---|---|---|")
    for trace, rate in sorted({k[1:3] for k in chunked}):
        cells = []
        for part in ("prefill", "decode"):
            for src in (chunked, plain):
                infaas, llumnix = (statistics.fmean(src[(system, trace, rate, s)][part]["p99"] for s in range(3))
                                   for system in ("infaas++", "llumnix"))
                cells.append(f"{infaas / llumnix:.2f}x")
        print(f"| {trace} | {rate:g} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
