"""Where a simulation's time goes: cProfile of ``llumnix simulate CONFIG``, summarised.

    .venv/bin/python benchmarks/sim/speed_profile.py benchmarks/sim/speed.yaml --src src \
        --label new --out benchmarks/sim/results/speed/profile.json

Writes (or adds ``--label``'s entry to) a small JSON: the run's events, function calls in
all and per event (these do not depend on the machine's load), and the top functions by
their own time (share of the profiled time; cProfile's per-call cost inflates functions
that make many small calls, so read shares, not seconds). The profiled run is a child
process with ``--src`` first on its path, so two source trees can be profiled alike.
"""
from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def profile(config: Path, src: Path, top: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="speed-profile-") as tmp:
        stats_file = Path(tmp) / "run.pstats"
        env = dict(os.environ, PYTHONPATH=str(src))
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats_file), "-m", "llumnix.cli",
                        "simulate", str(config), "--out", tmp], check=True, env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        sim = json.loads((Path(tmp) / "metrics.json").read_text())["records"][0]["sim"]
        st = pstats.Stats(str(stats_file))
    total = st.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in st.stats.items():  # type: ignore[attr-defined]
        where = file.split("/src/", 1)[-1] if "/src/" in file else file
        rows.append({"function": f"{where}:{line}({name})", "calls": ncalls,
                     "own_share": tottime / total, "cumulative_share": cumtime / total})
    rows.sort(key=lambda r: -r["own_share"])
    calls = st.total_calls  # type: ignore[attr-defined]
    return {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
            "num_events": sim["num_events"], "num_steps": sim["num_steps"], "function_calls": calls,
            "calls_per_event": calls / sim["num_events"], "profiled_s": total,
            "load_avg_1m": os.getloadavg()[0],
            "top": [dict(r, own_share=round(r["own_share"], 4), cumulative_share=round(r["cumulative_share"], 4))
                    for r in rows[:top]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "speed_profile.json")
    args = ap.parse_args(argv)
    result = profile(args.config.resolve(), args.src.resolve(), args.top)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc[args.label] = result
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.label}: {result['num_events']:,} events, {result['function_calls']:,} calls "
          f"({result['calls_per_event']:.0f} per event); written: {args.out}")
    for r in result["top"][:12]:
        print(f"  {r['own_share']:6.1%} own, {r['cumulative_share']:6.1%} cumulative, {r['calls']:>10,} calls  "
              f"{r['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
