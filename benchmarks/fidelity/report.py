"""The comparison as a text table, and CDFs of real against simulated latencies."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from benchmarks.fidelity.compare import METRICS, pool_real


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'load':<6} {'system':<9} {'metric':<16} {'sim':>9} {'real':>9} {'error':>8}"]
    for load, rows in report["table"].items():
        for system, row in rows.items():
            for m in METRICS:
                c = row[m]
                err = "-" if c["rel_error"] is None else f"{100 * c['rel_error']:+.1f}%"
                scale = 1.0 if m.startswith("num_") else 1000.0
                unit = "" if m.startswith("num_") else " ms"
                lines.append(f"{load:<6} {system:<9} {m + unit:<16} {scale * c['sim']:>9.1f} "
                             f"{scale * c['real']:>9.1f} {err:>8}")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Any]], png: Path, order: list[str], sim_key: str = "sim_in_run") -> None:
    """CDFs of TTFT and end-to-end latency, real (solid) against simulated (dashed), per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = {k.split("/")[0] for k in runs}
    loads = [ld for ld in order if ld in present]
    fig, axes = plt.subplots(len(loads), 2, figsize=(10, 3.6 * len(loads)), squeeze=False)
    colors = {"infaas++": "#4c72b0", "llumnix": "#dd8452"}
    for row, load in enumerate(loads):
        for col, metric in enumerate(("ttft", "e2e")):
            ax = axes[row][col]
            for key, run in sorted(runs.items()):
                sim_run = run.get(sim_key) or run.get("sim")
                if not key.startswith(load + "/") or not run.get("real_runs") or not sim_run:
                    continue
                system = key.split("/", 1)[1]
                reals = [run["real_runs"][i] for i in sim_run.get("real_runs", range(len(run["real_runs"])))]
                offset = statistics.median(r["serving_overhead"]["median_s"] for r in reals)
                real = np.sort(pool_real(reals)[metric])
                sim = np.sort(np.asarray(sim_run[metric]) + offset)
                c = colors.get(system)
                ax.plot(real, np.linspace(0, 1, len(real)), color=c, label=f"{system} real")
                ax.plot(sim, np.linspace(0, 1, len(sim)), color=c, ls="--", label=f"{system} sim")
            ax.set_xlabel(f"{'TTFT' if metric == 'ttft' else 'end-to-end latency'} (s)")
            ax.set_ylabel("CDF")
            ax.set_title(f"{load} load: {'TTFT' if metric == 'ttft' else 'end-to-end'}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("llumnix bench fidelity: real 2-instance cluster (solid) vs simulator (dashed),\n"
                 "the profile scaled to each run's prefill speed; each real run against its own simulation",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)

