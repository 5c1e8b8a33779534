"""Tables and plots of `llumnix simulate` records (matplotlib with the Agg backend). The
paper's comparison tables built on these are study code: benchmarks/sim/paper_tables.py."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

PLOTTED = (("prefill", "p99", "P99 prefill (s)"), ("prefill", "mean", "mean prefill (s)"),
           ("decode", "p99", "P99 decode (s/token)"), ("decode", "mean", "mean decode (s/token)"),
           ("e2e", "p99", "P99 end-to-end (s)"), ("preemption_loss", "mean", "mean preemption loss (s)"))


def mean_over_seeds(records: list[dict[str, Any]]) -> dict[tuple[str, float, str], dict[str, Any]]:
    """(trace, rate, system) -> record with each metric averaged over seeds."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["trace"], r["rate"], r["system"])].append(r)
    out = {}
    for key, rs in groups.items():
        merged: dict[str, Any] = {}
        for metric in ("prefill", "decode", "e2e", "preemption_loss"):
            merged[metric] = {s: float(np.mean([r[metric][s] for r in rs])) for s in ("mean", "p50", "p99")}
        merged["num_migrations"] = float(np.mean([r["migrations"]["num_committed"] for r in rs]))
        merged["num_preemptions"] = float(np.mean([r["num_preemptions"] for r in rs]))
        merged["wall_s"] = float(np.mean([r["sim"]["wall_s"] for r in rs]))
        out[key] = merged
    return out


def format_number(x: float) -> str:
    """Three significant digits; '-' for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def summary_table(records: list[dict[str, Any]]) -> str:
    """Plain-text table: one line per (trace, rate, system), seeds averaged."""
    rows = mean_over_seeds(records)
    head = (f"{'trace':10} {'rate':>6} {'system':12} {'prefill mean':>12} {'prefill p99':>12} "
            f"{'decode mean':>11} {'decode p99':>11} {'e2e p99':>9} {'preempt loss':>12} {'migr':>6}")
    lines = [head, "-" * len(head)]
    for (trace, rate, system), m in rows.items():
        lines.append(f"{trace:10} {rate:6g} {system:12} {format_number(m['prefill']['mean']):>12} "
                     f"{format_number(m['prefill']['p99']):>12} {format_number(m['decode']['mean']):>11} "
                     f"{format_number(m['decode']['p99']):>11} {format_number(m['e2e']['p99']):>9} "
                     f"{format_number(m['preemption_loss']['mean']):>12} {m['num_migrations']:>6.0f}")
    return "\n".join(lines)


def markdown_table(records: list[dict[str, Any]], trace: str) -> str:
    rows = {k: v for k, v in mean_over_seeds(records).items() if k[0] == trace}
    lines = ["| rate | system | prefill mean | prefill P99 | decode mean | decode P99 | e2e mean | e2e P99 "
             "| preemption loss mean | migrations |", "|" + "---|" * 10]
    for (_, rate, system), m in sorted(rows.items(), key=lambda kv: kv[0][1]):
        lines.append(f"| {rate:g} | {system} | {format_number(m['prefill']['mean'])} | {format_number(m['prefill']['p99'])} | "
                     f"{format_number(m['decode']['mean'])} | {format_number(m['decode']['p99'])} | {format_number(m['e2e']['mean'])} | "
                     f"{format_number(m['e2e']['p99'])} | {format_number(m['preemption_loss']['mean'])} | "
                     f"{m['num_migrations']:.0f} |")
    return "\n".join(lines) + "\n"


def write_plots(records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    rows = mean_over_seeds(records)
    traces = list(dict.fromkeys(r["trace"] for r in records))
    systems = list(dict.fromkeys(r["system"] for r in records))
    written = []
    for trace in traces:
        fig, axes = plt.subplots(2, 3, figsize=(13, 7))
        for ax, (metric, stat, label) in zip(axes.flat, PLOTTED, strict=False):
            for system in systems:
                pts = sorted((k[1], v[metric][stat]) for k, v in rows.items() if k[0] == trace and k[2] == system)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes.flat[0].legend()
        fig.suptitle(f"{trace}: latency vs request rate")
        fig.tight_layout()
        path = out / f"latency_vs_rate_{_slug(trace)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
        with_samples = [r for r in records if r["trace"] == trace and "_samples" in r]
        if with_samples:
            fig, axes = plt.subplots(1, 2, figsize=(11, 4))
            for ax, key, label in zip(axes, ("prefill", "decode"), ("prefill latency (s)", "decode (s/token)"),
                                      strict=False):
                for r in with_samples:
                    xs = np.sort(np.asarray(r["_samples"][key]))
                    if xs.size:
                        ax.plot(xs, np.arange(1, xs.size + 1) / xs.size, label=r["system"])
                ax.set_xscale("log")
                ax.set_xlabel(label)
                ax.set_ylabel("CDF")
                ax.grid(alpha=0.3)
            axes[0].legend()
            fig.suptitle(f"{trace} at {with_samples[0]['rate']:g} req/s")
            fig.tight_layout()
            path = out / f"cdf_{_slug(trace)}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name).lower()
