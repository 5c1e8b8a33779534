"""Writes long_prompt.csv: the long-prompt trace's lengths (prompts 1024-4096 tokens,
outputs 16-128, uniform, seed 0), in BurstGPT's columns so `kind: burstgpt, path:` reads
it (each run draws its requests from these rows with its own seed).

    python benchmarks/sim/pd/make_long_prompt.py
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

ROWS = 4000


def main() -> None:
    rng = np.random.default_rng(0)
    prompts = rng.integers(1024, 4097, ROWS)
    outputs = rng.integers(16, 129, ROWS)
    path = Path(__file__).with_name("long_prompt.csv")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Request tokens", "Response tokens"])
        w.writerows(zip(prompts.tolist(), outputs.tolist(), strict=True))
    print(f"wrote {ROWS} rows to {path}")


if __name__ == "__main__":
    main()
