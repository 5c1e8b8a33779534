"""Tables and plots of experiment records (matplotlib with the Agg backend)."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

PLOTTED = (("prefill", "p99", "P99 prefill (s)"), ("prefill", "mean", "mean prefill (s)"),
           ("decode", "p99", "P99 decode (s/token)"), ("decode", "mean", "mean decode (s/token)"),
           ("e2e", "p99", "P99 end-to-end (s)"), ("preemption_loss", "mean", "mean preemption loss (s)"))


def _mean_over_seeds(records: list[dict[str, Any]]) -> dict[tuple[str, float, str], dict[str, Any]]:
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


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def summary_table(records: list[dict[str, Any]]) -> str:
    """Plain-text table: one line per (trace, rate, system), seeds averaged."""
    rows = _mean_over_seeds(records)
    head = (f"{'trace':10} {'rate':>6} {'system':12} {'prefill mean':>12} {'prefill p99':>12} "
            f"{'decode mean':>11} {'decode p99':>11} {'e2e p99':>9} {'preempt loss':>12} {'migr':>6}")
    lines = [head, "-" * len(head)]
    for (trace, rate, system), m in rows.items():
        lines.append(f"{trace:10} {rate:6g} {system:12} {_fmt(m['prefill']['mean']):>12} "
                     f"{_fmt(m['prefill']['p99']):>12} {_fmt(m['decode']['mean']):>11} "
                     f"{_fmt(m['decode']['p99']):>11} {_fmt(m['e2e']['p99']):>9} "
                     f"{_fmt(m['preemption_loss']['mean']):>12} {m['num_migrations']:>6.0f}")
    return "\n".join(lines)


def markdown_table(records: list[dict[str, Any]], trace: str) -> str:
    rows = {k: v for k, v in _mean_over_seeds(records).items() if k[0] == trace}
    lines = ["| rate | system | prefill mean | prefill P99 | decode mean | decode P99 | e2e mean | e2e P99 "
             "| preemption loss mean | migrations |", "|" + "---|" * 10]
    for (_, rate, system), m in sorted(rows.items(), key=lambda kv: kv[0][1]):
        lines.append(f"| {rate:g} | {system} | {_fmt(m['prefill']['mean'])} | {_fmt(m['prefill']['p99'])} | "
                     f"{_fmt(m['decode']['mean'])} | {_fmt(m['decode']['p99'])} | {_fmt(m['e2e']['mean'])} | "
                     f"{_fmt(m['e2e']['p99'])} | {_fmt(m['preemption_loss']['mean'])} | "
                     f"{m['num_migrations']:.0f} |")
    return "\n".join(lines) + "\n"


def write_plots(records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    rows = _mean_over_seeds(records)
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


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else float("nan"))


def comparison_markdown(records: list[dict[str, Any]], ours: str = "llumnix", base: str = "infaas++",
                        worst: str = "round-robin") -> str:
    """Side by side on each trace's top rate, and the ordering ours <= base <= worst at every rate."""
    rows = _mean_over_seeds(records)
    traces = list(dict.fromkeys(r["trace"] for r in records))
    lines = [f"| trace | top rate | P99 prefill {base}/{ours} | mean prefill {base}/{ours} | "
             f"P99 decode {base}/{ours} | P99 e2e {base}/{ours} | preemption loss {ours} vs {base} | "
             f"P99 prefill {worst}/{ours} |", "|" + "---|" * 8]
    for t in traces:
        rates = sorted({k[1] for k in rows if k[0] == t})
        top = rates[-1]
        o, b, w = (rows.get((t, top, s)) for s in (ours, base, worst))
        if o is None or b is None:
            continue
        loss_o, loss_b = o["preemption_loss"]["mean"], b["preemption_loss"]["mean"]
        cut = f"{100 * (1 - loss_o / loss_b):.0f}% lower" if loss_b > 0 else "both 0"
        vs_worst = "-" if w is None else f"{_ratio(w['prefill']['p99'], o['prefill']['p99']):.1f}x"
        lines.append(
            f"| {t} | {top:g} | {_ratio(b['prefill']['p99'], o['prefill']['p99']):.1f}x | "
            f"{_ratio(b['prefill']['mean'], o['prefill']['mean']):.1f}x | "
            f"{_ratio(b['decode']['p99'], o['decode']['p99']):.2f}x | {_ratio(b['e2e']['p99'], o['e2e']['p99']):.2f}x | "
            f"{cut} | {vs_worst} |")
    violations = []
    for (t, rate, s), m in sorted(rows.items()):
        if s != ours:
            continue
        b, w = rows.get((t, rate, base)), rows.get((t, rate, worst))
        if b is None or w is None:
            continue
        for metric, stat in (("prefill", "p99"), ("preemption_loss", "mean")):
            chain = (m[metric][stat], b[metric][stat], w[metric][stat])
            if not chain[0] <= chain[1] * 1.0001 + 1e-9 or not chain[1] <= chain[2] * 1.0001 + 1e-9:
                gap = max(_ratio(chain[0], chain[1]), _ratio(chain[1], chain[2])) - 1
                violations.append(f"{t} @ {rate:g}: {metric} {stat} {ours}/{base}/{worst} = "
                                  + " / ".join(_fmt(x) for x in chain) + f" (out of order by {100 * gap:.1f}%)")
    lines.append("")
    if violations:
        lines.append(f"Ordering {ours} <= {base} <= {worst} broken at:")
        lines += [f"* {v}" for v in violations]
    else:
        lines.append(f"Ordering {ours} <= {base} <= {worst} holds at every rate, on P99 prefill and on "
                     "mean preemption loss.")
    return "\n".join(lines) + "\n"
