"""The peers against the paper's Llumnix at all five load-matched rates of every trace
(seed 0): P99 prefill and decode of each peer over Llumnix's (above 1: Llumnix better),
and how many points each side wins by more than 1%.

    .venv/bin/python benchmarks/sim/peers_all_rates.py [benchmarks/sim/results/peers-all-rates/metrics.json]
"""
from __future__ import annotations

import json
import sys

PEERS = ("power-of-two", "least-requests", "llm-d")


def main(path: str) -> None:
    with open(path) as f:
        recs = json.load(f)["records"]
    idx = {(r["system"], r["trace"], r["rate"]): r for r in recs if r["seed"] == 0}
    points = sorted({(r["trace"], r["rate"]) for r in recs})
    print("| trace | rate | Llumnix P99 prefill (s) | " + " | ".join(f"{p} / Llumnix" for p in PEERS)
          + " | Llumnix P99 decode (s/token) | " + " | ".join(f"{p} / Llumnix" for p in PEERS) + " |")
    print("|---|---|---|" + "---|" * len(PEERS) + "---|" + "---|" * len(PEERS))
    counts = {(m, p, side): 0 for m in ("prefill", "decode") for p in PEERS for side in ("llumnix", "peer")}
    for t, rate in points:
        cells = []
        for m in ("prefill", "decode"):
            base = idx[("llumnix", t, rate)][m]["p99"]
            cells.append(f"{base:.3g}")
            for p in PEERS:
                ratio = idx[(p, t, rate)][m]["p99"] / base
                cells.append(f"{ratio:.2f}")
                if ratio > 1.01:
                    counts[(m, p, "llumnix")] += 1
                elif ratio < 1 / 1.01:
                    counts[(m, p, "peer")] += 1
        print(f"| {t} | {rate:g} | " + " | ".join(cells) + " |")
    print()
    for m in ("prefill", "decode"):
        for p in PEERS:
            print(f"* P99 {m}, {p}: Llumnix better by more than 1% at {counts[(m, p, 'llumnix')]} of "
                  f"{len(points)} points, {p} at {counts[(m, p, 'peer')]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/sim/results/peers-all-rates/metrics.json")
