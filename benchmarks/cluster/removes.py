"""Why a request is moved again (issue 45): every committed migration of the simulator at
``sim_small``'s sizing, per request in order, and what the next move of the same request
looks like. ``python -m benchmarks.cluster.removes [--systems A,B] [--seeds 10] [--out F.json]``.

Per system: migrations committed, requests moved, moves per moved request; of the moves
that follow an earlier move of the same request (re-moves), how many take it back to the
instance it came from (``back``), and how long it stayed before the re-move began (median,
and the share within 0.1 s: a pass or two of triggered rescheduling). A re-move within a
pass or two means the destination gave up the request it had just taken: the move made it
a source.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from benchmarks.cluster.sim_small import simulate


def re_moves(reports: list[Any]) -> dict[str, Any]:
    """``reports``: one run's migration reports. Counts and stays of the re-moves."""
    by_request: dict[str, list[Any]] = defaultdict(list)
    for r in reports:
        if r.committed:
            by_request[r.request_id].append(r)
    stays: list[float] = []
    back = 0
    for moves in by_request.values():
        moves.sort(key=lambda r: r.start_time)
        for prev, nxt in zip(moves, moves[1:], strict=False):
            stays.append(nxt.start_time - prev.end_time)
            back += nxt.dst_instance_id == prev.src_instance_id
    return {"migrations": sum(len(m) for m in by_request.values()), "moved": len(by_request),
            "re_moves": len(stays), "back": back, "stays": stays}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="llumnix,llumnix pairing=even")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--requests", type=int, default=76)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--reschedule-every", type=int, default=10, help="status rounds per rescheduling round")
    ap.add_argument("--trigger-gap", type=float, default=0.03, help="a negative value: no trigger")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from llumnix.bench.cluster_bench import ClusterBenchSettings, scaled_pairs
    from llumnix.sim.sharegpt import sharegpt_lengths

    pairs = scaled_pairs(ClusterBenchSettings(), *sharegpt_lengths("smollm2"))
    gap = a.trigger_gap if a.trigger_gap >= 0 else None
    rows = []
    for name in a.systems.split(","):
        total: dict[str, Any] = {"migrations": 0, "moved": 0, "re_moves": 0, "back": 0, "stays": []}
        for seed in range(a.seeds):
            sim = simulate(name, pairs, a.requests, a.rate, seed, a.blocks, 16, instances=a.instances,
                           reschedule_every=a.reschedule_every, trigger_gap_s=gap)
            for k, v in re_moves(sim.metrics.migrations).items():
                total[k] += v
        stays = np.array(total.pop("stays"))
        row = {"system": name, **total, "moves_per_moved": total["migrations"] / max(1, total["moved"]),
               "stay_median_s": float(np.median(stays)) if stays.size else None,
               "re_moves_within_0.1s": int((stays < 0.1).sum())}
        rows.append(row)
        print(f"{name:>28}: {row['migrations']} moves of {row['moved']} requests "
              f"({row['moves_per_moved']:.2f} each); {row['re_moves']} re-moves, {row['back']} back where it came "
              f"from, {row['re_moves_within_0.1s']} within 0.1 s of the last, stay median "
              f"{(row['stay_median_s'] or 0) * 1e3:.0f} ms", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
