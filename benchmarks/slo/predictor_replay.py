"""Replays the steps of a real run (``real_cluster.py --raw``) through the step-time model
(``policy/predictor.py``) with and without its square-root feature: online (the RLS from
the A10 seed, each step predicted before it is fitted, as the cluster's predictor does;
one model per instance, the rounds in their run order) and in hindsight (the least-squares
fit of each round on its own steps: what no online fit of those features beats). Zeroing
a feature in the seed and in every step is exactly the model without it.

    PYTHONPATH=src .venv/bin/python benchmarks/slo/predictor_replay.py RAW.json [--out FILE.json]

Errors are |predicted / measured - 1| at P50 and P90 per round.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from llumnix.core.status import StepSample
from llumnix.policy.predictor import A10_LLAMA7B_SERVING, StepTimeModel, least_squares, sample_features

ROOT = 6
"""The square-root feature's index."""


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def errors(pairs: list[tuple[float, float]]) -> dict[str, float]:
    rel = [abs(p / m - 1) for p, m in pairs if m > 0]
    return {"n": len(rel), "p50": round(pct(rel, 0.5), 4), "p90": round(pct(rel, 0.9), 4)}


def features(step: list[Any], root: bool) -> tuple[list[float], float]:
    """A raw step ``[instance, predicted, *StepSample]``: its features and seconds."""
    s = StepSample(*step[2:])
    x = list(sample_features(s))
    if not root:
        x[ROOT] = 0.0
    return x, s.seconds


def replay(rounds: list[dict[str, Any]], root: bool) -> list[dict[str, Any]]:
    seed = list(A10_LLAMA7B_SERVING)
    if not root:
        seed[ROOT] = 0.0
    models: dict[str, StepTimeModel] = {}
    out = []
    for r in rounds:
        online: list[tuple[float, float]] = []
        rows: list[tuple[list[float], float]] = []
        for step in r["steps"]:
            m = models.setdefault(step[0], StepTimeModel(seed))
            x, y = features(step, root)
            online.append((m.predict_features(x), y))
            m.observe_features(x, y)
            rows.append((x, y))
        coef = least_squares([x for x, _ in rows], [y for _, y in rows])
        hindsight = [(max(1e-9, sum(c * v for c, v in zip(coef, x, strict=True))), y) for x, y in rows]
        out.append({"load": r["load"], "seed": r["seed"], "online": errors(online), "hindsight": errors(hindsight)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", help="real_cluster.py --raw's file")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rounds = json.loads(Path(args.raw).read_text())
    record: dict[str, Any] = {"raw": args.raw, "arms": {}}
    for name, root in (("linear", False), ("root", True)):
        rs = replay(rounds, root)
        record["arms"][name] = {
            "rounds": rs,
            "median": {f"{k}_{q}": statistics.median(r[k][q] for r in rs) for k in ("online", "hindsight")
                       for q in ("p50", "p90")}}
        print(name, " ".join(f"{r['load']}/{r['seed']}: online {r['online']['p50']:.3f} {r['online']['p90']:.3f}"
                             f" hindsight {r['hindsight']['p50']:.3f} {r['hindsight']['p90']:.3f} |" for r in rs))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
