"""Each preemption of a ``llumnix bench cluster --trace`` run, attributed, summed per
system and load over seeds (issue 32): ``python -m benchmarks.cluster.attribution
DIR/cluster.json [--markdown] [--out FILE.json]``.

    preempt       preemptions (the engine trace's count)
    repeat        of those, a request preempted again (its 2nd, 3rd... preemption)
    after install within 5 s of a migration into the same instance
    victim moved  the victim itself had migrated in
    avoidable     another instance had, as last polled, the free blocks the victim held:
                  a move (or a dispatch elsewhere) could have spared it. Migration can
                  avoid at most these: the bound on what llumnix can save over INFaaS++
    both full     the other instance had no free block
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def table(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for sysrec in data["systems"]:
        by_load: dict[str, list[dict[str, Any]]] = {}
        for run in sysrec["runs"]:
            if "preemption_trace" in run:
                by_load.setdefault(str(run["load"]), []).append(run)
        for load, runs in by_load.items():
            pre = [p for r in runs for p in r["preemption_trace"]["preemptions"]]
            seen: dict[tuple[int, str], int] = {}
            repeat = 0
            for r in runs:
                for p in r["preemption_trace"]["preemptions"]:
                    key = (r["seed"], p["rid"])
                    repeat += seen.get(key, 0) > 0
                    seen[key] = seen.get(key, 0) + 1
            rows.append({"system": sysrec["system"], "load": load, "seeds": [r["seed"] for r in runs],
                         "per_seed": [r["preemption_trace"]["summary"]["num_preemptions"] for r in runs],
                         "preempt": len(pre), "repeat": repeat,
                         "after_install": sum(p["recent_install"] for p in pre),
                         "victim_moved": sum(p["victim_migrated"] for p in pre),
                         "avoidable": sum(bool(p.get("other_could_take")) for p in pre),
                         "both_full": sum(p.get("other_free") == 0 for p in pre),
                         "installs": sum(r["preemption_trace"]["summary"]["installs"] for r in runs),
                         "migrations": [r["migrations_committed"] for r in runs]})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ("system", "load", "per_seed", "preempt", "repeat", "after_install", "victim_moved", "avoidable",
            "both_full", "installs")
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cluster_json", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not a.cluster_json.is_file():
        raise SystemExit(f"attribution: no such file {a.cluster_json} (a `llumnix bench cluster --trace` output)")
    rows = table(json.loads(a.cluster_json.read_text()))
    print(markdown(rows) if a.markdown else json.dumps(rows, indent=1))
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
