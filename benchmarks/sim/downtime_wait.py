"""Where a simulated migration's downtime goes after the commit (issue 49).

A migration's downtime runs from the pause on the source to the destination's first
step with the request. This study runs one config's first run, logs every engine step
(start, end, prefill or decode) and splits each committed migration's wait between
commit and that first step:

* ``boundary``: the rest of the destination's step in flight at the commit;
* ``prefill``: whole prefill steps the destination ran after it without the request
  (vLLM 0.1.x's engine: a step that can admit queued requests is a prefill step, and
  running requests wait for a decode step);
* ``decode``: whole decode steps without it (none is expected).

The split is ``llumnix.bench.downtime_split``'s, shared with `llumnix bench migration
--arrivals` and `downtime_matched.py` (the same scenario on the real engine).

    .venv/bin/python benchmarks/sim/downtime_wait.py [benchmarks/sim/speed.yaml] [--set k=v]

Prints the distributions and writes JSON to ./llumnix-results/downtime_wait/ (``--out``).
"""
from __future__ import annotations

import argparse
import json
import platform
from collections import defaultdict
from pathlib import Path
from typing import Any

from llumnix.bench.downtime_split import quantiles, split_wait
from llumnix.migration.protocol import MigrationReport
from llumnix.sim.config import load_config
from llumnix.sim.events import Event
from llumnix.sim.instance import SimInstance
from llumnix.sim.latency import get_latency_model
from llumnix.sim.policy_bridge import make_policy
from llumnix.sim.runner import plan
from llumnix.sim.simulator import Simulator
from llumnix.sim.workloads import make_trace

Steps = dict[str, list[tuple[float, float, bool]]]


def logged_steps() -> Steps:
    """Wrap ``SimInstance.start_step`` so every step's (start, end, is_prefill) is kept."""
    steps: Steps = defaultdict(list)
    original = SimInstance.start_step

    def start_step(self: SimInstance, now: float) -> Event | None:
        ev = original(self, now)
        if ev is not None and self._batch is not None:
            steps[self.instance_id].append((now, ev.time, self._batch.is_prefill))
        return ev

    SimInstance.start_step = start_step  # type: ignore[method-assign]
    return steps


def study(config: str, overrides: list[str]) -> dict[str, Any]:
    spec = plan(load_config(config, overrides))[0]
    steps = logged_steps()
    reports: list[MigrationReport] = []
    sim = Simulator(spec.cluster, get_latency_model(spec.latency_model),
                    make_policy(spec.system, spec.cluster, seed=spec.seed),
                    make_trace(spec.trace, spec.rate, spec.seed), priorities=spec.system.priorities)
    sim.metrics.on_migration = reports.append  # type: ignore[method-assign,assignment]
    sim.run()
    rows: list[dict[str, float]] = []
    for r in reports:
        if not r.committed or "resumed" not in r.marks:
            continue
        parts = split_wait(r.end_time, r.marks["resumed"], steps[r.dst_instance_id])
        rows.append({"downtime": float(r.downtime or 0.0), "before_commit": r.end_time - r.marks["paused"],
                     "wait": r.marks["resumed"] - r.end_time, **parts})
    out: dict[str, Any] = {"config": config, "overrides": overrides, "num_migrations": len(rows),
                           "machine": {"python": platform.python_version()}}
    for key in ("downtime", "before_commit", "wait", "boundary", "prefill"):
        out[key] = quantiles([row[key] for row in rows])
    long = [row for row in rows if row["wait"] > 0.2]
    out["waits_over_200ms"] = {"num": len(long), "with_prefill_steps": sum(1 for r in long if r["num_prefill_steps"]),
                               "prefill_share": sum(r["prefill"] for r in long) / max(1e-9, sum(r["wait"] for r in long))}
    out["num_with_decode_steps_without_it"] = sum(1 for row in rows if row["decode"] > 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default=str(Path(__file__).parent / "speed.yaml"))
    ap.add_argument("--set", action="append", default=[], help="a config override, as llumnix simulate's")
    ap.add_argument("--out", default="llumnix-results/downtime_wait")
    args = ap.parse_args()
    out = study(args.config, args.set)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "downtime_wait.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
